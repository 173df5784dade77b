"""Retention GC against a real job: GC runs over and over while the job checkpoints, is killed
and restored; primary storage stays bounded, every retained checkpoint stays restorable, the
output stays exact, and ``shared_state_files`` tells the truth about what is stored."""

from __future__ import annotations

import time

import pytest
from dagster import instance_for_test

from orchestration.definitions import defs
from orchestration.resources import CutlinePaths
from spark_jobs.delta_catalog import CatalogReader
from spark_jobs.gc import collect_garbage
from spark_jobs.job import get_job
from spark_jobs.runtime import RuntimePaths
from state.catalog import CheckpointStatus
from state.restore import read_manifest, validate_checkpoint
from state.storage import open_storage
from tests.e2e_util import completed_checkpoints, cutline, kill_driver, run_to_end, wait_for
from tests.test_exactly_once import IDLE, JOB, make_home, output, reference_output

pytestmark = [pytest.mark.slow, pytest.mark.spark]

GRACE_S = 4.0


def verify_retained(paths: RuntimePaths) -> list[int]:
    """Every COMPLETED checkpoint validates, checksums included; returns their ids."""
    storage = open_storage(paths.checkpoint_root)
    ids = []
    for row in CatalogReader(paths.warehouse).checkpoints(JOB, (CheckpointStatus.COMPLETED,)):
        problems = validate_checkpoint(
            read_manifest(storage, row.metadata_path), storage, checksums=True
        )
        assert not problems, f"checkpoint {row.checkpoint_id}: {problems}"
        ids.append(row.checkpoint_id)
    return ids


def settled_bytes(paths: RuntimePaths, since_s: float) -> tuple[int, int]:
    """Bytes under the job's root older than ``since_s`` (outside the grace window, whose
    uploads may belong to pending checkpoints), and their bound: (num_retained + 1) x the
    largest retained checkpoint (the +1: a checkpoint subsumed within the grace period)."""
    storage = open_storage(paths.checkpoint_root)
    old = sum(i.size for i in storage.list(JOB) if i.modified < since_s and "/_acks/" not in i.path)
    rows = CatalogReader(paths.warehouse).checkpoints(JOB)
    full = max(r.full_size for r in rows if r.status == CheckpointStatus.COMPLETED)
    return old, (get_job(JOB).checkpoint.num_retained + 1) * full


def test_gc_while_the_job_runs_and_restores_keeps_storage_bounded_and_output_exact(
    spark, tmp_path, tmp_path_factory
):
    reference = reference_output(JOB, tmp_path_factory.mktemp("reference"))
    home = make_home(tmp_path, "home")
    paths = RuntimePaths.under(home)
    passes, deleted, worst = 0, 0, 0.0

    history = []
    measure = False  # the slowed-down first attempt has checkpoints pending beyond the grace

    def gc_pass() -> None:  # GC "on a schedule": every 2 s
        nonlocal passes, deleted, worst
        time.sleep(2)
        started = time.time()
        report = collect_garbage(spark, JOB, paths, grace_s=GRACE_S, log=lambda *_: None)
        passes += 1
        deleted += report.files_deleted
        old, limit = settled_bytes(paths, started - GRACE_S)
        history.append((old, limit, report.stored_bytes, report.retained, report.protected))
        if measure:
            worst = max(worst, old / limit)

    # uploads slowed down: checkpoints stay pending for a while, with their files in storage
    slow = {"CUTLINE_FAULT_UPLOAD_DELAY_S": "2"}
    proc = cutline(home, "run", JOB, "--idle-timeout", IDLE, env=slow)
    wait_for(lambda: completed_checkpoints(home, JOB), 300, "a first checkpoint", proc)
    while len(completed_checkpoints(home, JOB)) < 4:
        assert proc.poll() is None, "the first attempt ended before it was killed"
        gc_pass()
    kill_driver(proc)
    gc_pass()  # while nothing runs: the killed attempt still says RUNNING
    verify_retained(paths)

    proc = cutline(home, "run", JOB, "--idle-timeout", IDLE)  # restores, runs to the end
    measure = True
    while proc.poll() is None:
        gc_pass()
    assert proc.returncode == 0, (home / "driver.log").read_text()[-3000:]
    time.sleep(GRACE_S)
    gc_pass()
    print(f"\n{passes} GC passes, {deleted} files deleted; settled/bound at worst {worst:.2f}")
    assert deleted > 0 and worst <= 1.0, history
    retained = verify_retained(paths)
    assert len(retained) == get_job(JOB).checkpoint.num_retained
    assert output(home) == reference

    # the registry tells the truth: LIVE rows are exactly the stored shared files
    storage = open_storage(paths.checkpoint_root)
    stored = {i.path[len(JOB) + 1 :] for i in storage.list(JOB) if "/shared/" in "/" + i.path}
    rows = CatalogReader(paths.warehouse).shared_files(JOB)
    assert {r["path"] for r in rows if r["status"] == "LIVE"} == stored
    assert all(r["deleted_at_ms"] for r in rows if r["status"] == "DELETED")
    latest = read_manifest(
        storage, CatalogReader(paths.warehouse).checkpoints(JOB)[-1].metadata_path
    )
    for r in rows:
        if r["path"] in latest.shared_paths():
            assert r["refcount"] >= 1 and r["last_used"] == latest.checkpoint_id

    # a later run restores the latest checkpoint after all that GC
    run_to_end(home, "run", JOB, "--idle-timeout", "3")
    assert output(home) == reference


def test_dry_run_deletes_nothing_and_the_dagster_job_reports_what_it_reclaimed(spark, tmp_path):
    home = make_home(tmp_path, "home")
    run_to_end(home, "run", JOB, "--idle-timeout", IDLE)
    paths = RuntimePaths.under(home)
    storage = open_storage(paths.checkpoint_root)
    before = sorted(i.path for i in storage.list(JOB))
    dry = collect_garbage(spark, JOB, paths, dry_run=True, grace_s=0, log=lambda *_: None)
    assert dry.files_deleted > 0
    assert sorted(i.path for i in storage.list(JOB)) == before

    with instance_for_test() as instance:
        result = defs.get_job_def("retention_job").execute_in_process(
            instance=instance,
            run_config={"ops": {"retention_gc": {"config": {"grace_s": 0.0}}}},
            resources={"cutline_paths": CutlinePaths(home=str(home))},
        )
    assert result.success
    (mat,) = [
        e.event_specific_data.materialization
        for e in result.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
    ]
    assert mat.partition == JOB
    assert mat.metadata["files_deleted"].value == dry.files_deleted
    assert mat.metadata["bytes_reclaimed"].value == dry.bytes_reclaimed
    assert len(list(storage.list(JOB))) == len(before) - dry.files_deleted
    verify_retained(paths)
