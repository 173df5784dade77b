"""Writing states into a savepoint from tables (state/state_writer.py, state/savepoint_writer.py),
on real RocksDB over the local filesystem and moto's S3 server: what the reader reads out of a
checkpoint, written back at another layout, reads back as a reference computed from the users alone
(value, list, map and TTL states; the reader is checked against that reference on state the
views wrote, tests/test_state_reader.py); written over a base, the states written are the
reference's with the change and the others the reference's, and the history is the base's;
tables that do not fit the state are refused naming the column, key or state."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from state.paths import JobLayout, SavepointLayout
from state.savepoint import read_savepoint
from state.savepoint_writer import write_states_savepoint
from state.state_reader import read_state
from state.state_types import KeyCodec
from state.state_writer import StateWriteError, encode_state
from tests.test_savepoint import beside
from tests.test_state_reader import (
    FRESH,
    JOB,
    LAST,
    MAX,
    SEEN,
    TOTAL,
    USERS,
    number,
    reference,
    sorted_rows,
    write_all,
    write_and_snapshot,
)

CODEC = KeyCodec("string", MAX)
KEY = ("user",)
SPECS = [TOTAL, SEEN, LAST, FRESH]
FINGERPRINTS = {"stage": {s.name: s.fingerprint() for s in SPECS}}


def read_all(manifest, storage, tmp_path, layout=None) -> dict[str, list[dict]]:
    return {
        s.name: sorted_rows(
            read_state(manifest, storage, "stage", s, CODEC, KEY, tmp_path / "scratch", layout)
        )
        for s in SPECS
    }


@pytest.fixture
def checkpoint(tmp_path, storage):
    manifest = write_and_snapshot(tmp_path, storage, SPECS, CODEC, pa.array(USERS), write_all)
    tables = {
        s.name: read_state(manifest, storage, "stage", s, CODEC, KEY, tmp_path / "scratch")
        for s in SPECS
    }
    return manifest, tables


def encoded(tables: dict[str, pa.Table]) -> dict[str, list]:
    specs = {s.name: s for s in SPECS}
    return {"stage": [encode_state(t, specs[n], CODEC, KEY, n) for n, t in tables.items()]}


def test_what_is_read_written_back_reads_back_the_same(checkpoint, storage, tmp_path):
    _, tables = checkpoint
    target = beside(storage, tmp_path, "new")
    info = write_states_savepoint(
        encoded(tables),
        target,
        job_id=JOB,
        stages=FINGERPRINTS,
        parallelism=3,  # another layout than the tables came from: keys go by key group
        max_parallelism=MAX,
        positions={"clicks": {"0": 5}},
    )
    saved = read_savepoint(target)
    assert saved.bootstrapped and saved.batch_id == 0 and info.file_count == saved.file_count
    assert saved.source_positions == {"clicks": {"0": 5}}
    assert sorted(h.subtask for h in saved.subtasks) == [0, 1, 2]
    assert read_all(saved, target, tmp_path, SavepointLayout()) == reference(USERS)


def test_over_a_base_the_states_written_change_and_the_rest_stays(checkpoint, storage, tmp_path):
    manifest, tables = checkpoint
    total = tables["total"]
    dropped = USERS[:100]
    fixed = total.filter(pc.invert(pc.is_in(total.column("user"), pa.array(dropped))))
    fixed = fixed.set_column(2, "value", pc.multiply(fixed.column("value"), 10))
    target = beside(storage, tmp_path, "fixed")
    write_states_savepoint(
        encoded({"total": fixed.drop_columns(["key_group"])}),
        target,
        job_id=JOB,
        stages=FINGERPRINTS,
        parallelism=5,  # ignored: the base's layout is kept
        max_parallelism=MAX,
        base=(manifest, storage, JobLayout(JOB)),
    )
    saved = read_savepoint(target)
    assert not saved.bootstrapped and saved.batch_id == manifest.batch_id
    assert sorted(h.subtask for h in saved.subtasks) == [0, 1]
    after = read_all(saved, target, tmp_path, SavepointLayout())
    kept = [u for u in USERS if u not in dropped]
    expected = reference(USERS)
    assert after["total"] == [  # the reference's totals, the dropped users gone, times 10
        {**r, "value": 30 * number(r["user"])} for r in reference(kept)["total"]
    ]
    assert {n: after[n] for n in ("seen", "last", "fresh")} == {
        n: expected[n] for n in ("seen", "last", "fresh")
    }


def test_tables_that_do_not_fit_are_refused_naming_what(checkpoint):
    _, tables = checkpoint
    total = tables["total"]
    with pytest.raises(StateWriteError, match=r"missing \['value'\]; unexpected \['amount'\]"):
        encode_state(total.rename_columns(["user", "key_group", "amount"]), TOTAL, CODEC, KEY, "t")
    wrong_group = total.set_column(1, "key_group", pc.add(total.column("key_group"), 1))
    with pytest.raises(StateWriteError, match=r"key 'u.*' is in key group .*, not "):
        encode_state(wrong_group, TOTAL, CODEC, KEY, "t")
    twice = pa.concat_tables([total.slice(0, 3), total.slice(1, 1)])
    with pytest.raises(StateWriteError, match=r"key 'u.*' appears 2 times"):
        encode_state(twice, TOTAL, CODEC, KEY, "t")
    text = total.set_column(2, "value", pa.array(["x"] * total.num_rows))
    with pytest.raises(StateWriteError, match=r"^t: "):
        encode_state(text, TOTAL, CODEC, KEY, "t")
    with pytest.raises(StateWriteError, match=r"missing \['expires_at_ms'\]"):
        encode_state(tables["fresh"].drop_columns(["expires_at_ms"]), FRESH, CODEC, KEY, "f")
