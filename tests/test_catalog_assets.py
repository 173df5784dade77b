"""The catalog assets and their checks, over the catalog and checkpoints of a real job run."""

from __future__ import annotations

import shutil
import time

import pytest
from dagster import instance_for_test, materialize

import orchestration.assets.checks as checks
from orchestration.assets.catalog import completed_checkpoints, shared_state_files, streaming_jobs
from orchestration.assets.savepoints import savepoints
from orchestration.resources import CutlinePaths, S3Resource
from spark_jobs.catalog.delta_catalog import DeltaCatalog
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.driver.run import run_job
from spark_jobs.job_loader import get_job
from spark_jobs.sources.generate import generate
from state.catalog import CheckpointStatus
from state.restore import read_manifest
from state.savepoint import read_savepoint
from state.storage import open_storage
from tests.reference import before_cut, read_log

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.landing]

JOB = "clicks_per_user"


@pytest.fixture(scope="module")
def finished(spark, tmp_path_factory):
    """A home in which clicks_per_user ran to its end, and the run's summary."""
    home = tmp_path_factory.mktemp("assets") / "home"
    generate(home / "log", "clicks", "clicks", count=60_000, seed=3)
    summary = run_job(
        spark, get_job(JOB), RuntimePaths.under(home), idle_timeout_s=4, log=lambda *_: None
    )
    return home, summary


@pytest.fixture
def home(finished, tmp_path):
    """A copy of the finished home that a test may damage."""
    copy = tmp_path / "home"
    shutil.copytree(finished[0], copy)
    return copy


def test_assets_report_each_table_for_the_partition(finished):
    home, summary = finished
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("streaming_jobs", [JOB])
        result = materialize(
            [streaming_jobs, completed_checkpoints, shared_state_files],
            partition_key=JOB,
            instance=instance,
            resources={"cutline_paths": CutlinePaths(home=str(home))},
        )
    assert result.success

    def metadata(asset: str) -> dict:
        (mat,) = result.asset_materializations_for_node(asset)
        assert mat.partition == JOB
        return {k: v.value for k, v in mat.metadata.items()}

    jobs = metadata("streaming_jobs")
    assert (jobs["attempts"], jobs["latest_status"]) == (1, "FINISHED")
    chk = metadata("completed_checkpoints")
    assert chk["latest_checkpoint_id"] == str(summary.checkpoints[-1])
    assert chk["latest_full_size_mib"] > 0 and "full MiB" in chk["checkpoints_table"]
    assert chk["completed"] + chk["subsumed"] == len(summary.checkpoints)
    assert chk["completed"] == min(get_job(JOB).checkpoint.num_retained, len(summary.checkpoints))
    files = metadata("shared_state_files")
    assert files["live_files"] > 0 and files["live_mib"] > 0


def check(fn, home) -> tuple[bool, dict]:
    result = fn(cutline_paths=CutlinePaths(home=str(home)), s3=S3Resource())
    return result.passed, {k: v.value for k, v in result.metadata.items()}


def freshness(home) -> tuple[bool, dict]:
    result = checks.checkpoint_freshness(cutline_paths=CutlinePaths(home=str(home)))
    return result.passed, {k: v.value for k, v in result.metadata.items()}


def test_all_checks_pass_on_a_healthy_job(finished):
    home, _ = finished
    for fn in (checks.no_dangling_references, checks.storage_bounded):
        passed, metadata = check(fn, home)
        assert passed, metadata
        assert metadata["jobs_checked"] == 1
    assert freshness(home)[0]


def test_a_missing_file_is_a_dangling_reference(home):
    paths = CutlinePaths(home=str(home))
    latest = paths.catalog().checkpoints(JOB)[-1]
    manifest = read_manifest(paths.storage(), latest.metadata_path)
    victim = next(f for f in manifest.files() if f.shared)
    (home / "checkpoints" / JOB / victim.path).unlink()
    passed, metadata = check(checks.no_dangling_references, home)
    assert not passed
    assert victim.path in metadata["problems"][f"{JOB}/chk-{latest.checkpoint_id}"]


def test_storage_beyond_the_bound_fails(home, monkeypatch):
    monkeypatch.setattr(checks, "lawful_garbage_s", lambda grace_s: 0.0)  # no recent uploads
    assert check(checks.storage_bounded, home)[0]
    junk = home / "checkpoints" / JOB / "shared" / "orphan.sst"
    junk.write_bytes(b"\0" * (10 << 20))  # an orphan bigger than the bound
    passed, metadata = check(checks.storage_bounded, home)
    assert not passed and JOB in metadata["problems"]


def test_a_running_job_without_a_recent_checkpoint_is_stale(home, spark, monkeypatch):
    catalog = DeltaCatalog(RuntimePaths.under(home).catalog)
    catalog.begin_attempt(JOB, run_id="run-2")  # running, no checkpoint of its own yet
    passed, metadata = freshness(home)
    assert passed and JOB in metadata["checkpoint_age_s"]
    monkeypatch.setattr(checks, "FRESHNESS_INTERVALS", 0)
    time.sleep(0.01)
    passed, metadata = freshness(home)
    assert not passed and "latest checkpoint" in metadata["problems"][JOB]


def test_the_restore_drill_reads_every_state_and_fails_on_a_damaged_file(home):
    passed, metadata = check(checks.restore_drill, home)
    assert passed, metadata
    paths = CutlinePaths(home=str(home))
    latest = paths.catalog().checkpoints(JOB, (CheckpointStatus.COMPLETED,))[-1]
    drill = metadata["drills"][JOB]
    assert drill["checkpoint_id"] == latest.checkpoint_id and drill["restore_s"] > 0
    # one aggregates entry per user with clicks before the checkpoint's cut, counted by pandas
    cut = latest.source_positions["clicks"]
    clicks = read_log(home, "clicks")
    before = before_cut(clicks, cut)
    assert drill["rows"] == {"count_by_user/aggregates": before["user"].nunique()}, drill
    manifest = read_manifest(paths.storage(), latest.metadata_path)
    victim = max((f for f in manifest.files() if f.shared), key=lambda f: f.size)
    path = home / "checkpoints" / JOB / victim.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum tells
    path.write_bytes(bytes(data))
    passed, metadata = check(checks.restore_drill, home)
    assert not passed
    assert victim.path in metadata["problems"][JOB] and "checksum" in metadata["problems"][JOB]


def test_materializing_savepoints_saves_a_finished_job_and_lists_it(home):
    """A finished job's output is committed through its latest checkpoint: the asset copies
    that checkpoint into a self-contained savepoint and reports it."""
    paths = CutlinePaths(home=str(home))
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("streaming_jobs", [JOB])
        result = materialize(
            [savepoints],
            partition_key=JOB,
            instance=instance,
            resources={"cutline_paths": paths, "s3": S3Resource()},
        )
    assert result.success
    (mat,) = result.asset_materializations_for_node("savepoints")
    metadata = {k: v.value for k, v in mat.metadata.items()}
    latest = paths.catalog().checkpoints(JOB, (CheckpointStatus.COMPLETED,))[-1]
    saved = read_savepoint(open_storage(metadata["location"]))
    assert saved.checkpoint_id == latest.checkpoint_id == int(metadata["checkpoint_id"])
    assert metadata["size_mib"] > 0 and not metadata["stopped"]
    assert metadata["location"].startswith(f"file://{home}/warehouse/savepoints/{JOB}/")
    assert metadata["location"] in metadata["savepoints"]
