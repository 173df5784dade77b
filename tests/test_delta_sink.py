"""The Delta sink with two live attempts (delta-rs only, no Spark): each attempt stages apart and
commits only what it staged; once the newer attempt fenced the table, the older commits nothing;
a redone commit commits nothing twice; every commit records where its epochs ended."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cutline.sinks.delta import DeltaSinkWriter
from spark_jobs.catalog.tables import read_delta
from state.catalog import FencedError

ENDS = {e: {"clicks": {"0": 100 * e, "1": 90 * e}} for e in range(10)}


def roots(tmp_path) -> tuple[str, str]:
    """The output and staging roots of a test's sinks."""
    return str(tmp_path / "tables"), str(tmp_path / "staging")


def stage(sink: DeltaSinkWriter, epoch: int, users: list[str], subtask: int = 0) -> None:
    """What a subtask of ``sink``'s attempt stages for ``epoch``."""
    table = pa.table({"user": users, "n": [epoch] * len(users)})
    sink.staged.write(epoch, f"part-{subtask:05d}", table)


def rows(sink: DeltaSinkWriter) -> list[tuple]:
    data = read_delta(sink.table_path)
    return sorted(zip(data["user"].to_pylist(), data["_epoch"].to_pylist(), strict=True))


def test_an_older_attempt_never_adds_to_what_a_newer_one_commits(tmp_path):
    old = DeltaSinkWriter("job", "out", "out", *roots(tmp_path), attempt=1)
    old.fence()
    stage(old, 0, ["a", "b"])
    assert old.commit_through(0, ENDS) == 2
    stage(old, 1, ["a"])  # staged, its checkpoint still pending, when attempt 2 starts
    new = DeltaSinkWriter("job", "out", "out", *roots(tmp_path), attempt=2)
    new.fence()
    new.discard_other_attempts()
    stage(old, 2, ["zombie"])  # the older attempt goes on staging after the newer one started
    stage(new, 1, ["a", "c"])
    stage(new, 2, ["d"])
    with pytest.raises(FencedError, match="fenced from sink 'out': attempt 2 started"):
        old.commit_through(2, ENDS)
    assert new.commit_through(2, ENDS) == 3
    assert rows(new) == [("a", 0), ("a", 1), ("b", 0), ("c", 1), ("d", 2)]
    assert new.commit_through(2, ENDS) == 0, "a redone commit commits nothing twice"
    assert new.committed_epoch() == 2
    assert new.committed_ends(0) == {1: ENDS[1], 2: ENDS[2]}


def test_a_restore_redoes_the_commit_of_the_attempt_that_staged_it(tmp_path):
    """Checkpoint n completed in the catalog, its driver died before the sink commit: the next
    attempt commits what the dead attempt staged, once."""
    dead = DeltaSinkWriter("job", "out", "out", *roots(tmp_path), attempt=1)
    dead.fence()
    stage(dead, 0, ["a"])
    stage(dead, 1, ["b"])
    stage(dead, 2, ["c"])  # after the checkpoint's epoch: recomputed, never committed
    restorer = DeltaSinkWriter("job", "out", "out", *roots(tmp_path), attempt=2)
    restorer.fence()
    assert restorer.commit_through(1, ENDS, staged_by=1) == 2
    restorer.discard_other_attempts()
    assert rows(restorer) == [("a", 0), ("b", 1)]
    assert restorer.has_output() and restorer.staged.epochs(1) == []
    assert restorer.reset() == 2 and not restorer.has_output()


def test_epochs_without_output_are_committed_and_recorded(tmp_path):
    """A checkpoint whose epochs had no output still commits them (no rows): the history says
    where every committed epoch ended, which a replay after a fallback needs."""
    sink = DeltaSinkWriter("job", "out", "out", *roots(tmp_path), attempt=1)
    sink.fence()
    assert sink.commit_through(1, ENDS) == 0  # epochs 0 and 1: nothing staged
    assert sink.committed_epoch() == 1 and not sink.has_output()
    stage(sink, 3, ["a"])
    assert sink.commit_through(3, ENDS) == 1
    assert sink.commit_through(4, ENDS) == 0
    assert sink.committed_epoch() == 4
    assert sink.committed_ends(-1) == {e: ENDS[e] for e in range(5)}
    assert rows(sink) == [("a", 3)]
