"""KeyedProcess stages in one subtask, on a real RocksDB store: the sessionization example over
micro-batches against the pandas reference, TTL keeping state flat, and user errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from cutline_sessions.jobs import Sessionize, sessions

from cutline.errors import UserCodeError
from cutline.job import KeyedProcess
from cutline.keyed_process import KeyedProcessFunction, ProcessOperator, UserFunctionError
from spark_jobs.errors import TaskError, carry_to_driver, task_error
from spark_jobs.executor.subtask import write_progress
from state.backend import StateBackendError
from state.keygroups import KeyGroupRange
from state.rocksdb_store import RocksDBStore
from state.state_types import MapStateSpec, Ttl, ValueStateSpec
from tests.e2e_util import report
from tests.reference import sessions_of

ALL = KeyGroupRange(0, 127)  # one subtask owns every key group


def clicks(n: int, users: int, seed: int = 3) -> pd.DataFrame:
    """Clicks in event-time order with up to 2 s of disorder, 10 ms apart."""
    rng = np.random.default_rng(seed)
    ts = 1_000_000 + np.arange(n) * 10 - rng.integers(0, 2_000, n)
    return pd.DataFrame(
        {
            "user": [f"u{u}" for u in rng.integers(0, users, n)],
            "url": [f"/p/{p}" for p in rng.integers(0, 20, n)],
            "ts": ts,
        }
    )


def run_batches(op: ProcessOperator, store: RocksDBStore, frames, lag: int) -> list[pa.Table]:
    """Each frame as one micro-batch, the watermark as the runtime computes it; then one empty
    micro-batch at the final watermark (the final checkpoint's)."""
    watermark, outputs = None, []
    empty = pa.Table.from_pandas(frames[0].iloc[:0], preserve_index=False)
    for frame in [*frames, None]:
        table = empty if frame is None else pa.Table.from_pandas(frame, preserve_index=False)
        result = op.apply(store, table, watermark, processing_time=0)
        result.txn.commit()
        outputs.append(result.output)
        if result.max_event_time is not None:
            candidate = result.max_event_time - lag
            watermark = candidate if watermark is None else max(watermark, candidate)
    return [o for o in outputs if o.num_rows]


def test_sessionize_over_micro_batches_equals_the_pandas_reference(tmp_path):
    job = sessions(gap_ms=3_000)
    data = clicks(12_000, users=200)
    with RocksDBStore(tmp_path / "db", ALL) as store:
        op = ProcessOperator(job.operator, job.max_parallelism)
        frames = [data.iloc[i : i + 1_000] for i in range(0, len(data), 1_000)]
        out = pa.concat_tables(run_batches(op, store, frames, lag=2_000)).to_pandas()
    expected = sessions_of(data, 3_000)  # those the final watermark closed
    expected = expected[expected["session_end"] + 3_000 <= data["ts"].max() - 2_000]
    columns = ["user", "session_start", "session_end", "clicks", "pages", "session_no"]
    got = out[columns].sort_values(columns[:2]).reset_index(drop=True)
    want = expected[columns].sort_values(columns[:2]).reset_index(drop=True)
    assert len(got) > 500
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


class Counter(KeyedProcessFunction):
    """Per key: a count that expires ``ttl`` ms of event time after its last update."""

    def __init__(self, ttl: int | None) -> None:
        ttl_spec = Ttl(ttl, clock="event") if ttl else None
        self.states = (ValueStateSpec("n", pa.int64(), ttl=ttl_spec),)

    def process_batch(self, records, ctx):
        counts = records.group_by("user").aggregate([("ts", "count")])
        users = counts.column("user")
        before = ctx.state("n").get(users).fill_null(0)
        ctx.state("n").update(users, pa.compute.add(before, counts.column("ts_count")))
        return None


def live_entries(store: RocksDBStore, name: str) -> int:
    return sum(sum(1 for _ in store.items(name, kg)) for kg in ALL)


@pytest.mark.parametrize("ttl", [None, 5_000])
def test_a_ttl_keeps_the_state_of_idle_keys_bounded(tmp_path, ttl):
    """Users are active for 2 s of event time each, then never again: without a TTL the state
    grows with every user ever seen; with a 5 s TTL it stays flat."""
    stage = KeyedProcess("count", {"s": "user"}, "string", Counter(ttl), event_time="ts")
    sizes, sst = [], []
    with RocksDBStore(tmp_path / "db", ALL) as store:
        op = ProcessOperator(stage, 128)
        watermark = None
        for batch in range(40):
            ts = np.arange(batch * 1_000, (batch + 1) * 1_000, 2)
            users = [f"u{t // 2_000}-{t % 20}" for t in ts.tolist()]
            table = pa.table({"user": users, "ts": ts})
            result = op.apply(store, table, watermark, processing_time=0)
            write_progress(result.txn, store, 1, batch)  # as the subtask commits it
            result.txn.commit()
            watermark = result.max_event_time
            if batch % 10 == 9:
                store.compact()
                sizes.append(live_entries(store, "n"))
                disk = sum(f.stat().st_size for f in (tmp_path / "db").glob("*.sst"))
                sst.append(disk)
    report(
        f"TTL {ttl}: live keys after 10, 20, 30, 40 micro-batches: {sizes}; "
        f"SST bytes after compaction: {sst}"
    )
    if ttl is None:
        assert sizes == sorted(sizes) and sizes[-1] >= 3.5 * sizes[0]
    else:
        assert max(sizes) <= 1.2 * min(sizes), sizes
        assert max(sizes) <= 80  # the users of the last 5 s of event time, and not more


class Broken(KeyedProcessFunction):
    states = (MapStateSpec("m", pa.int64()),)

    def process_batch(self, records, ctx):
        return self.helper(records)

    def helper(self, records):
        raise ZeroDivisionError("user code divided by zero")


def test_a_raising_function_names_the_stage_and_keeps_the_traceback(tmp_path):
    stage = KeyedProcess("divide", {"s": "user"}, "string", Broken(), uid="div_1")
    with RocksDBStore(tmp_path / "db", ALL) as store, pytest.raises(UserFunctionError) as err:
        ProcessOperator(stage, 128).apply(store, pa.table({"user": ["a"]}), None, 0)
    text = str(err.value)
    assert text.startswith(
        "stage 'divide' (uid 'div_1', Broken.process_batch) raised ZeroDivisionError"
    )
    assert "in helper" in text and "user code divided by zero" in text
    # in a Spark task it leaves marked; the driver finds it in Spark's report and raises it
    with pytest.raises(TaskError) as marked, carry_to_driver():
        raise err.value
    wrapped = f"org.apache.spark.SparkException: ...\n{marked.value}\n\tat org.apache.spark.Foo"
    error = task_error(wrapped)
    assert isinstance(error, UserFunctionError) and isinstance(error, UserCodeError)
    assert str(error) == text.strip()


class WrongOutput(KeyedProcessFunction):
    output_schema = pa.schema([("user", pa.string()), ("n", pa.int64())])

    def process_batch(self, records, ctx):
        return pd.DataFrame({"user": ["a"], "count": [1]})


def test_output_that_does_not_match_the_declared_schema_is_an_error(tmp_path):
    stage = KeyedProcess("wrong", {"s": "user"}, "string", WrongOutput())
    with RocksDBStore(tmp_path / "db", ALL) as store, pytest.raises(UserFunctionError) as err:
        ProcessOperator(stage, 128).apply(store, pa.table({"user": ["a"]}), None, 0)
    assert "stage 'wrong': process_batch's output does not match output_schema" in str(err.value)


def test_sessionize_declares_its_states_with_fingerprints():
    schema = sessions().operator.state_schema()
    assert schema == {
        "__key__": "key<string>",
        "times": "list<int64>/no-ttl/v1",
        "pages": "list<string>/no-ttl/v1",
        "totals": "map<string,int64>/ttl/v1",
    }
    assert isinstance(sessions().operator.function, Sessionize)


class ReadsItsState(KeyedProcessFunction):
    states = (ValueStateSpec("seen", "int64"),)

    def process_batch(self, records, ctx):
        ctx.state("seen").get(records.column("user"))
        return None


class FullDisk:
    """A RocksDB handle whose reads fail as a full disk's do."""

    def __init__(self, db) -> None:
        self.db = db

    def get(self, keys):
        raise Exception("IO error: No space left on device: While appending to file")

    def __getattr__(self, name):
        return getattr(self.db, name)


def test_a_state_backend_failure_under_a_users_call_is_the_runtimes_not_the_users(tmp_path):
    """A RocksDB error raised while the user's function reads its state is not called the user's
    fault (exit 2, never restarted): it stays the runtime's (a restore may fix it) and says where
    (issue 36)."""
    stage = KeyedProcess("reader", {"s": "user"}, "string", ReadsItsState(), uid="r_1")
    with RocksDBStore(tmp_path / "db", ALL) as store:
        store._db = FullDisk(store._db)
        with pytest.raises(StateBackendError) as err:
            ProcessOperator(stage, 128).apply(store, pa.table({"user": ["a"]}), None, 0)
        store._db = store._db.db
    assert not isinstance(err.value, UserCodeError)
    assert str(err.value).startswith(
        f"disk full (no space left on device): RocksDB read failed in {tmp_path / 'db'} on "
    )
    assert str(err.value).endswith("(key groups 0..127)")
    assert "IO error: No space left on device" in str(err.value.__cause__)  # RocksDB's words
