"""cutline.testing's harness: the clocks, timers and TTL it drives, the inputs it takes, and its
errors. The example packages' own tests (examples/*/tests) use it on their functions."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from cutline import KeyedContext, KeyedProcess, KeyedProcessFunction, Ttl, ValueStateSpec
from cutline.testing import Harness


class Reminders(KeyedProcessFunction):
    """Per key: remember the last value for 1 s of processing time; a processing-time timer
    100 ms after each record emits the key."""

    states = (ValueStateSpec("last", pa.int64(), ttl=Ttl(1_000)),)

    def process_batch(self, records: pa.Table, ctx: KeyedContext) -> None:
        keys = ctx.key_of(records)
        ctx.state("last").update(keys, records.column("v"))
        ctx.register_processing_timers(keys, [ctx.processing_time + 100] * len(keys))

    def on_timers(self, timers: pa.Table, ctx: KeyedContext) -> pa.Table:
        return timers.select(["k", "timestamp", "domain"])


def reminders() -> KeyedProcess:
    return KeyedProcess("reminders", {"input": "k"}, "string", Reminders())


def test_processing_time_timers_fire_when_the_clock_reaches_them_and_ttl_expires():
    with Harness(reminders(), processing_time=1_000) as h:
        assert h.process([{"k": "a", "v": 1}]).num_rows == 0
        assert h.set_processing_time(1_099).num_rows == 0
        fired = h.set_processing_time(1_100).to_pylist()
        assert fired == [{"k": "a", "timestamp": 1_100, "domain": "processing"}]
        assert h.set_processing_time(1_500).num_rows == 0, "a timer fires once"
        assert h.state("last").get(pa.array(["a"])).to_pylist() == [1]
        h.set_processing_time(2_001)
        assert h.state("last").get(pa.array(["a"])).to_pylist() == [None]
        with pytest.raises(ValueError, match="goes back"):
            h.set_processing_time(5)


def test_lists_of_dicts_pandas_frames_and_arrow_tables_are_the_same_records():
    rows = [{"k": "a", "v": 1}, {"k": "b", "v": 2}]
    outputs = []
    for records in (rows, pd.DataFrame(rows), pa.Table.from_pylist(rows)):
        with Harness(reminders()) as h:
            h.process(records)
            outputs.append(h.set_processing_time(100).to_pylist())
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0]) == 2


def test_a_snapshot_restores_into_a_new_harness_with_its_clocks():
    with Harness(reminders(), processing_time=50) as h:
        h.process([{"k": "a", "v": 7}])
        snapshot = h.snapshot()
        with Harness(reminders(), restore=snapshot) as restored:
            assert restored.processing_time == 50
            assert restored.state("last").get(pa.array(["a"])).to_pylist() == [7]
            assert restored.set_processing_time(150).column("k").to_pylist() == ["a"]


def test_bad_calls_are_refused_naming_what_is_wrong():
    two = KeyedProcess("two", {"left": "k", "right": "k"}, "string", Reminders())
    with Harness(two) as h:
        with pytest.raises(ValueError, match="pass a dict of records by name"):
            h.process([{"k": "a", "v": 1}])
        with pytest.raises(ValueError, match=r"reads no source\(s\) \[.middle.\]"):
            h.process({"middle": [{"k": "a", "v": 1}]})
        with pytest.raises(KeyError, match="'nope'"):
            h.state("nope")
    with pytest.raises(ValueError, match="no state for stage"):
        other = KeyedProcess("other", {"input": "k"}, "string", Reminders())
        with Harness(reminders()) as h:
            Harness(other, restore=h.snapshot())
