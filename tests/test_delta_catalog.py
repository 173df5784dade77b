"""The Delta catalog: rows, statuses, and attempt fencing through Delta transaction ids."""

from __future__ import annotations

import json

import pytest

from spark_jobs.delta_catalog import TABLES, DeltaCatalog, _is_conflict
from state.catalog import CheckpointStatus, CompletedCheckpoint, FencedError

pytestmark = pytest.mark.spark


def row(cid: int, attempt: int, **kw) -> CompletedCheckpoint:
    fields = dict(
        job_id="clicks",
        checkpoint_id=cid,
        batch_id=cid * 3,
        attempt=attempt,
        trigger_time_ms=1000 * cid,
        complete_time_ms=1000 * cid + 50,
        metadata_path=f"clicks/chk-{cid}/_metadata",
        full_size=100 * cid,
        incremental_size=10,
        file_count=4,
        sync_ms=1.5,
        async_ms=20.0,
        source_positions={"log": {"0": cid, "1": 2 * cid}},
    )
    fields.update(kw)
    return CompletedCheckpoint(**fields)


def test_commit_status_and_fencing(spark, tmp_path):
    catalog = DeltaCatalog(spark, tmp_path / "warehouse")
    first = catalog.begin_attempt("clicks", run_id="run-1")
    assert first == 1
    catalog.commit_checkpoint(row(1, first))
    catalog.commit_checkpoint(row(2, first))
    catalog.mark_subsumed("clicks", [1])
    rows = catalog.checkpoints("clicks")
    assert [(r.checkpoint_id, r.status) for r in rows] == [
        (1, CheckpointStatus.SUBSUMED),
        (2, CheckpointStatus.COMPLETED),
    ]
    assert rows[1] == row(2, first)

    second = catalog.begin_attempt("clicks", run_id="run-2", restored_from=2)
    assert second == 2
    with pytest.raises(FencedError, match="attempt 1 of clicks is fenced"):
        catalog.commit_checkpoint(row(3, first))
    catalog.commit_checkpoint(row(3, second))
    catalog.mark_corrupt("clicks", 3, "missing file")
    assert [
        r.checkpoint_id for r in catalog.checkpoints("clicks", (CheckpointStatus.CORRUPT,))
    ] == [3]
    assert [j["attempt"] for j in catalog.jobs("clicks")] == [1, 2]
    # attempt 1 was still marked RUNNING (its driver died without saying so): now LOST
    assert [j["status"] for j in catalog.jobs("clicks")] == ["LOST", "RUNNING"]
    assert catalog.jobs("clicks")[1]["restored_from"] == 2
    assert catalog.checkpoints("other") == []
    catalog.set_job_status("clicks", 1, "FAILED", "driver 'killed' \\ -9")
    assert catalog.jobs("clicks")[0]["status"] == "FAILED"
    assert catalog.jobs("clicks")[0]["failure_reason"] == "driver 'killed' \\ -9"
    catalog.set_restored("clicks", 2, 2, {"0": "host-a", "1": "host-b"})
    assert json.loads(catalog.jobs("clicks")[1]["allocation"]) == {"0": "host-a", "1": "host-b"}
    before = catalog.jobs("clicks")[1]["last_heartbeat_ms"]
    catalog.heartbeat("clicks", 2)
    assert catalog.jobs("clicks")[1]["last_heartbeat_ms"] >= before


def test_commit_conflicts_are_recognised_converted_or_wrapped(spark):
    from delta.exceptions.captured import ConcurrentAppendException

    assert _is_conflict(ConcurrentAppendException("Files were added to [job_id=x]", stackTrace=""))
    wrapped = RuntimeError(
        "An error occurred while calling o123.execute.\n: io.delta.exceptions."
        "ConcurrentAppendException: Files were added to partition [job_id=clicks] by a "
        "concurrent update. Please try the operation again."
    )
    assert _is_conflict(wrapped)
    from deltalake.exceptions import CommitFailedError

    assert _is_conflict(CommitFailedError("Transaction failed: version already exists"))
    assert not _is_conflict(ValueError("column refcount not found"))


def test_restart_path_writes_run_no_spark_job_and_merge_older_schemas(spark, tmp_path):
    """What a restarting driver writes before its first micro-batch (the fencing commit
    included) goes through delta-rs: a Spark job on a freshly started JVM costs seconds.
    A recoveries table from before the placement columns gains them."""
    older = TABLES["recoveries"].split(", files_local")[0]
    recoveries = tmp_path / "warehouse" / "catalog" / "recoveries"
    spark.createDataFrame([], older).write.format("delta").partitionBy("job_id").save(
        str(recoveries)
    )
    catalog = DeltaCatalog(spark, tmp_path / "warehouse")
    attempt = catalog.begin_attempt("clicks")
    sc = spark.sparkContext
    sc.setJobGroup("restart-path", "catalog writes of a restore")
    try:
        assert catalog.begin_attempt("clicks") == attempt + 1  # marks attempt 1 LOST
        catalog.set_restored("clicks", attempt + 1, None, {"0": "host-a"})
        catalog.record_recovery(
            {"job_id": "clicks", "attempt": attempt + 1, "checkpoint_id": 7, "placement": "[]"}
        )
        catalog.heartbeat("clicks", attempt + 1)
        spark_jobs = sc.statusTracker().getJobIdsForGroup("restart-path")
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert spark_jobs == []
    assert [j["status"] for j in catalog.jobs("clicks")] == ["LOST", "RUNNING"]
    assert catalog.jobs("clicks")[1]["restored_from"] is None
    [recovery] = catalog.recoveries("clicks")
    assert (recovery["checkpoint_id"], recovery["placement"], recovery["files_local"]) == (
        7,
        "[]",
        None,
    )


def test_a_start_is_planned_without_spark_while_the_session_starts(spark, tmp_path):
    """Once the tables exist, a driver begins its attempt (fencing the older one) and chooses
    its checkpoint, marking a bad one CORRUPT, with no Spark session at all."""
    from spark_jobs.runtime import plan_start
    from state.storage import open_storage

    warehouse = tmp_path / "warehouse"
    assert not DeltaCatalog.tables_exist(warehouse)
    catalog = DeltaCatalog(spark, warehouse)
    assert DeltaCatalog.tables_exist(warehouse)
    first = catalog.begin_attempt("clicks")
    catalog.commit_checkpoint(row(1, first))  # its manifest was never written

    sparkless = DeltaCatalog(None, warehouse)
    storage = open_storage(str(tmp_path / "checkpoints"))
    logged: list[str] = []
    with pytest.raises(RuntimeError, match="no restorable checkpoint of clicks"):
        plan_start(sparkless, storage, "clicks", "latest", "run-2", logged.append)
    assert "checkpoint 1 is not restorable, marking it CORRUPT" in logged[0]
    assert [r.status for r in catalog.checkpoints("clicks")] == [CheckpointStatus.CORRUPT]
    assert [(j["attempt"], j["status"]) for j in catalog.jobs("clicks")] == [
        (1, "LOST"),
        (2, "RUNNING"),
    ]
    with pytest.raises(FencedError):  # the new attempt fenced the old one
        catalog.commit_checkpoint(row(2, first))

    plan = plan_start(sparkless, storage, "clicks", None, "run-3")
    assert (plan.attempt, plan.manifest, plan.fallbacks) == (3, None, [])
