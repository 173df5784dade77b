"""State compaction on real RocksDB: a long incremental chain is measured, compacted at a
barrier, and the next checkpoint's restore reads fewer files with the same contents; the request
file a running job reads round-trips, rejects bad input and is never GC's to delete. End to end:
a running job asked through ``cutline compact`` compacts at its next barrier, and a restore after
that reads fewer files than the restore before it, with exact output."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spark_jobs.catalog.tables import CatalogReader
from spark_jobs.deploy.settings import RuntimePaths
from state.compaction import (
    COMPACT_REQUEST,
    CompactionRequest,
    CompactionRequestError,
    clear_request,
    read_request,
    source_checkpoints,
    subtasks_to_compact,
    write_request,
)
from state.gc import Retention, plan_gc
from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.registry import StoredFile
from state.restore import restore_subtask
from tests.e2e_util import (
    ROOT,
    checkpoints_so_far,
    cutline,
    kill_driver,
    report,
    wait_for,
)
from tests.reference import check
from tests.test_snapshot_restore import JOB, Subtask, contents_of


@pytest.fixture
def sub(tmp_path, storage):
    s = Subtask(tmp_path, storage, incremental=True, local_recovery=False)
    yield s
    s.store.close()
    s.pool.shutdown()


def manifest_of(*handles) -> CheckpointManifest:
    return CheckpointManifest(JOB, handles[0].checkpoint_id, 1, 1, 0, {}, tuple(handles))


def test_a_compacted_checkpoint_restores_from_fewer_files_with_the_same_state(sub, tmp_path):
    handle = None
    for cid in range(1, 9):  # eight checkpoints, each adding an L0 file to the chain
        sub.write(cid * 1000, 3000, b"v%d" % cid)
        handle = sub.snapshotter.snapshot(sub.store, cid, handle).result()
    before = handle
    assert source_checkpoints(before) == 8
    assert subtasks_to_compact(manifest_of(before), max_files=100, max_checkpoints=4) == {
        0: "files from 8 checkpoints > 4"
    }
    assert subtasks_to_compact(manifest_of(before), max_files=3, max_checkpoints=8) == {
        0: f"{len(before.files)} files > 3"
    }

    sub.store.compact()  # what a subtask does at the barrier of a requested compaction
    after = sub.snapshotter.snapshot(sub.store, 9, before).result()
    assert source_checkpoints(after) == 1
    assert (
        subtasks_to_compact(manifest_of(after), max_files=len(after.files), max_checkpoints=1) == {}
    )

    layout = JobLayout(JOB)
    read_before = restore_subtask(before, sub.storage, layout, tmp_path / "r1")
    read_after = restore_subtask(after, sub.storage, layout, tmp_path / "r2")
    report(
        f"\nrestore reads {read_before.files_remote} files before, {read_after.files_remote} after"
    )
    assert read_after.files_remote < read_before.files_remote
    assert contents_of(tmp_path / "r2") == contents_of(tmp_path / "r1") == sub.contents()


def test_request_round_trip_and_only_the_served_request_is_cleared(storage):
    layout = JobLayout(JOB)
    assert read_request(storage, layout) is None
    first = CompactionRequest((1, 0), 1000, 7, "files from 20 checkpoints > 16")
    write_request(storage, layout, first)
    got = read_request(storage, layout)
    assert got == CompactionRequest((0, 1), 1000, 7, first.reason)
    newer = CompactionRequest((0,), 2000, 8, "forced")
    write_request(storage, layout, newer)
    assert not clear_request(storage, layout, got)  # a newer request waits for the next barrier
    assert read_request(storage, layout) == newer
    assert clear_request(storage, layout, newer)
    assert read_request(storage, layout) is None


@pytest.mark.parametrize(
    "doc",
    [b"not json", b'{"requested_at_ms": 1}', b'{"subtasks": [-1], "requested_at_ms": 1}',
     b'{"subtasks": "0", "requested_at_ms": 1}', b'{"subtasks": [0], "requested_at_ms": "soon"}'],
)  # fmt: skip
def test_a_malformed_request_is_a_clear_error(storage, doc):
    layout = JobLayout(JOB)
    storage.put_bytes(layout.job_path(COMPACT_REQUEST), doc)
    with pytest.raises(CompactionRequestError, match="not a valid compaction request"):
        read_request(storage, layout)


def test_gc_never_deletes_a_pending_request():
    old = 0.0  # far older than any grace period
    files = [StoredFile(COMPACT_REQUEST, 100, old), StoredFile("shared/op/0/x-abc.sst", 10, old)]
    plan = plan_gc(
        Retention([], [], []), {}, files, latest_completed=0, now_ms=10**12, grace_s=1,
        running=False,
    )  # fmt: skip
    assert [f.path for f in plan.delete] == ["shared/op/0/x-abc.sst"]


@pytest.mark.slow
@pytest.mark.spark
def test_a_running_job_compacts_when_asked_and_then_restores_from_fewer_files(tmp_path):
    job, home = "clicks_per_user", tmp_path / "home"
    (home / "log").mkdir(parents=True)
    generator = subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), "generate", "clicks",
         "--count", "180000", "--rate", "3000", "--users", "5000"],
        cwd=ROOT,
    )  # fmt: skip
    reader = CatalogReader(RuntimePaths.under(home).catalog)
    request = home / "checkpoints" / job / COMPACT_REQUEST
    proc = cutline(home, "run", job, "--idle-timeout", "10")
    try:
        # attempt 1 builds a chain of incremental checkpoints and is killed
        wait_for(lambda: len(checkpoints_so_far(home, job)) >= 4, 300, "4 checkpoints", proc)
        kill_driver(proc)
        # attempt 2 restores that chain, is asked to compact while it runs, and is killed
        proc = cutline(home, "run", job, "--idle-timeout", "10")
        wait_for(lambda: reader.recoveries(job), 300, "the first restore", proc)
        asked = subprocess.run(
            [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), "compact", job,
             "--max-checkpoints", "1", "--json"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        )  # fmt: skip
        decision = json.loads(asked.stdout)
        assert decision["requested"] == [0, 1], decision
        assert request.exists()
        wait_for(lambda: not request.exists(), 120, "the request to be served", proc)
        kill_driver(proc)
        assert generator.wait(timeout=300) == 0
        # attempt 3 restores the compacted checkpoint and runs to the end of the input
        proc = cutline(home, "run", job, "--until-caught-up")
        assert proc.wait(timeout=300) == 0, (home / "driver.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            kill_driver(proc)
        generator.kill()
    log = (home / "driver.log").read_text()
    assert "compact their state first" in log and "state compacted at checkpoint" in log

    first, second = reader.recoveries(job)
    files = [r["files_local"] + r["files_remote"] for r in (first, second)]
    report(f"\nrestore before compaction: {files[0]} files; after: {files[1]} files")
    assert files[1] < files[0]
    report(check("clicks_per_user", home))
