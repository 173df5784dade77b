"""The Delta catalog: rows, statuses, and attempt fencing through Delta transaction ids."""

from __future__ import annotations

import json
import time

import pytest

from spark_jobs.catalog.delta_catalog import DeltaCatalog, is_conflict
from spark_jobs.catalog.tables import CATALOG_TABLE_PROPERTIES
from spark_jobs.catalog.upkeep import maintain
from state.catalog import CheckpointStatus, CompletedCheckpoint, FencedError
from tests.e2e_util import report


def catalog_at(root) -> DeltaCatalog:
    return DeltaCatalog(root / "warehouse" / "catalog")


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request, tmp_path) -> str:
    """A catalog root on the local disk, or on the S3 server."""
    if request.param == "local":
        return str(tmp_path / "warehouse" / "catalog")
    return request.getfixturevalue("s3_root") + "/catalog"


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


def test_commit_status_and_fencing(root):
    catalog = DeltaCatalog(root)
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


def test_commit_conflicts_are_recognised():
    from deltalake.exceptions import CommitFailedError

    assert is_conflict(CommitFailedError("Transaction failed: version already exists"))
    assert not is_conflict(ValueError("column refcount not found"))


def test_a_table_of_an_older_schema_gains_the_new_columns(tmp_path):
    """A recoveries table from before the placement columns gains them on the next append."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from spark_jobs.catalog.tables import arrow_schema

    schema = arrow_schema("recoveries")
    older = schema.remove(schema.get_field_index("files_local"))
    older = pa.schema([f for f in older if f.name not in ("files_remote", "placement")])
    recoveries = tmp_path / "warehouse" / "catalog" / "recoveries"
    write_deltalake(str(recoveries), older.empty_table(), partition_by=["job_id"])
    catalog = catalog_at(tmp_path)
    attempt = catalog.begin_attempt("clicks")
    assert catalog.begin_attempt("clicks") == attempt + 1  # marks attempt 1 LOST
    catalog.set_restored("clicks", attempt + 1, None, {"0": "host-a"})
    catalog.record_recovery(
        {"job_id": "clicks", "attempt": attempt + 1, "checkpoint_id": 7, "placement": "[]"}
    )
    catalog.heartbeat("clicks", attempt + 1)
    assert [j["status"] for j in catalog.jobs("clicks")] == ["LOST", "RUNNING"]
    assert catalog.jobs("clicks")[1]["restored_from"] is None
    [recovery] = catalog.recoveries("clicks")
    assert (recovery["checkpoint_id"], recovery["placement"], recovery["files_local"]) == (
        7,
        "[]",
        None,
    )


def test_a_start_is_planned_without_spark_while_the_session_starts(tmp_path):
    """A driver creates the tables, begins its attempt (fencing the older one) and chooses
    its checkpoint with no Spark session at all. A root that holds none of the checkpoints is a
    configuration error and marks nothing; a manifest naming a missing file is evidence: CORRUPT,
    and with nothing left to restore the start refuses to begin from nothing."""
    import dataclasses

    from spark_jobs.deploy.settings import RuntimePaths
    from spark_jobs.driver.attempt_start import plan_start
    from spark_jobs.errors import ConfigurationError, NoRestorableCheckpointError
    from spark_jobs.job_loader import get_job
    from state.handles import StateFile, SubtaskStateHandle
    from state.keygroups import KeyGroupRange
    from state.manifest import CheckpointManifest
    from state.storage import open_storage

    job = dataclasses.replace(get_job("clicks_per_user"), name="clicks")
    paths = RuntimePaths.under(tmp_path)
    assert not DeltaCatalog.tables_exist(paths.catalog)
    catalog = DeltaCatalog(paths.catalog)
    assert DeltaCatalog.tables_exist(paths.catalog)
    first = catalog.begin_attempt("clicks")
    catalog.commit_checkpoint(row(1, first))  # its manifest was never written

    sparkless = DeltaCatalog(paths.catalog)
    storage = open_storage(paths.checkpoint_root)
    logged: list[str] = []
    with pytest.raises(ConfigurationError, match="holds none of the manifests"):
        plan_start(sparkless, storage, job, paths, "latest", "run-2", logged.append)
    assert [r.status for r in catalog.checkpoints("clicks")] == [CheckpointStatus.COMPLETED]

    lost = StateFile("000009.sst", "shared/op/0/000009-x.sst", 10, "crc32:00000000")
    handle = SubtaskStateHandle("op", 0, KeyGroupRange(0, 127), 1, (lost,))
    manifest = CheckpointManifest("clicks", 1, 3, first, 1000, {"log": {"0": 1}}, (handle,))
    storage.put_bytes("clicks/chk-1/_metadata", manifest.to_json())
    with pytest.raises(NoRestorableCheckpointError, match="does not start over"):
        plan_start(sparkless, storage, job, paths, "latest", "run-3", logged.append)
    assert "checkpoint 1 is not restorable, marking it CORRUPT" in logged[-1]
    assert [r.status for r in catalog.checkpoints("clicks")] == [CheckpointStatus.CORRUPT]
    assert [(j["attempt"], j["status"]) for j in catalog.jobs("clicks")] == [
        (1, "LOST"),
        (2, "FAILED"),
        (3, "FAILED"),
    ]
    with pytest.raises(FencedError):  # the new attempts fenced the old one
        catalog.commit_checkpoint(row(2, first))

    plan = plan_start(sparkless, storage, job, paths, None, "run-4")  # an explicit start-over
    assert (plan.attempt, plan.manifest, plan.fallbacks) == (4, None, [])


def test_two_starters_never_share_an_attempt_number(root):
    """Eight threads begin attempts of the same job at once: eight distinct numbers, and every
    attempt but the newest is fenced."""
    from concurrent.futures import ThreadPoolExecutor

    DeltaCatalog(root)
    catalogs = [DeltaCatalog(root) for _ in range(8)]

    def begin(catalog):
        try:
            return catalog.begin_attempt("clicks")
        except FencedError as e:  # lost the fencing race to a newer starter: superseded
            return str(e)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(begin, catalogs))
    numbers = [r["attempt"] for r in catalogs[0].jobs("clicks")]
    assert sorted(numbers) == list(range(1, 9)), numbers
    newest = max(numbers)
    for attempt in numbers:
        if attempt == newest:
            catalogs[0].commit_checkpoint(row(attempt, attempt))
        else:
            with pytest.raises(FencedError):
                catalogs[0].commit_checkpoint(row(attempt, attempt))
    report(f"8 concurrent starters: attempts {sorted(numbers)}; {results}")


@pytest.mark.spark
def test_registry_rewrites_never_lose_to_the_jobs_appends_and_replan_after_removals(
    spark, tmp_path
):
    """GC's registry rewrite commits although the job appended new rows (a blind append, as a
    completed checkpoint registers its files) between its read and its commit; it is planned
    again, on the rows as they are then, when a concurrent commit removed files it read; the
    catalog compacts and checkpoints the table; and delta-spark reads what they wrote (so a
    user may query the catalog from Spark)."""
    from deltalake import DeltaTable

    from spark_jobs.catalog.shared_files import RegistryChanges
    from spark_jobs.catalog.tables import read_delta

    catalog = catalog_at(tmp_path)
    table = catalog.path("shared_state_files")

    def files(cid: int, n: int, job: str = "clicks") -> list[dict]:
        return [
            {"job_id": job, "path": f"shared/op/{i % 2}/{cid:06d}-{i}.sst", "operator": "op",
             "subtask": i % 2, "size": 100 + i, "created_by": cid, "last_used": cid,
             "refcount": 1, "status": "LIVE"}
            for i in range(n)
        ]  # fmt: skip

    catalog.record_shared_files(files(1, 3))
    catalog.record_shared_files(files(2, 3) + files(1, 2, job="other"))
    plans: list[int] = []

    def retire_first_checkpoint(rows: list[dict]) -> RegistryChanges:
        plans.append(len(rows))
        if len(plans) == 1:  # the job registers checkpoint 3's files meanwhile
            catalog.record_shared_files(files(3, 2))
        deleted = {"status": "DELETED", "deleted_at_ms": 1234, "refcount": 0}
        added = {**files(0, 1)[0], "path": "shared/op/0/lost.sst", "created_by": 2}
        return RegistryChanges({r["path"]: deleted for r in rows if r["created_by"] == 1}, [added])

    versions = DeltaTable(table).version()
    result = catalog.update_shared_files("clicks", retire_first_checkpoint)
    assert (result.conflicts, result.rows_changed, result.rows_added, plans) == (0, 3, 1, [6])
    assert DeltaTable(table).version() == versions + 2  # the job's append, then the rewrite

    def statuses(job: str = "clicks") -> list[tuple]:
        rows = read_delta(table, job).to_pylist()
        return sorted((r["created_by"], r["path"], r["status"], r["refcount"]) for r in rows)

    assert [s[2] for s in statuses()] == ["DELETED"] * 3 + ["LIVE"] * 6
    assert [s[2] for s in statuses("other")] == ["LIVE", "LIVE"]

    # another pass rewrote (removed) files meanwhile: this plan is discarded and made again
    other_pass = catalog_at(tmp_path)
    plans.clear()

    def touch_live(rows: list[dict]) -> RegistryChanges:
        plans.append(len(rows))
        if len(plans) == 1:
            live = next(r["path"] for r in rows if r["status"] == "LIVE")
            other_pass.update_shared_files(
                "clicks", lambda _: RegistryChanges({live: {"refcount": 2}})
            )
        return RegistryChanges({r["path"]: {"last_used": 7} for r in rows if r["status"] == "LIVE"})

    result = catalog.update_shared_files("clicks", touch_live)
    assert (result.conflicts, plans) == (1, [9, 9])
    after = read_delta(table, "clicks").to_pylist()
    assert sorted(r["last_used"] for r in after if r["status"] == "LIVE") == [7] * 6
    assert sorted(r["refcount"] for r in after if r["status"] == "LIVE") == [1] * 5 + [2]
    assert all(r["last_used"] == 1 for r in after if r["status"] == "DELETED")

    # delta-spark reads the rewritten files (data skipping has only their row counts), and the
    # table as compacted and checkpointed
    columns = ["job_id", "path", "status", "refcount", "last_used"]

    def spark_rows() -> list[tuple]:
        df = spark.read.format("delta").load(table).select(*columns)
        return sorted(tuple(r) for r in df.collect())

    def rs_rows() -> list[tuple]:
        return sorted(tuple(r[c] for c in columns) for r in read_delta(table).to_pylist())

    assert spark_rows() == rs_rows()
    deleted = spark.read.format("delta").load(table).where("job_id = 'clicks' AND refcount = 0")
    assert deleted.count() == 3
    counts = maintain(catalog)
    assert counts["shared_state_files"] == 3  # per job partition: its LIVE rows, the rest
    assert spark_rows() == rs_rows()
    assert catalog.update_shared_files("clicks", lambda _: RegistryChanges()).committed is False


def test_a_table_replays_at_most_ten_commits_and_older_tables_get_the_property(tmp_path):
    """Every catalog table checkpoints its log every 10 commits, so opening it reads the latest
    checkpoint and at most 10 commits after it; a catalog made before that gets the property at
    its next maintenance."""
    from deltalake import DeltaTable

    catalog = catalog_at(tmp_path)
    attempt = catalog.begin_attempt("clicks")
    for _ in range(24):
        catalog.heartbeat("clicks", attempt)
    log = tmp_path / "warehouse" / "catalog" / "streaming_jobs" / "_delta_log"
    version = DeltaTable(str(log.parent)).version()
    checkpointed = json.loads((log / "_last_checkpoint").read_text())["version"]
    assert version >= 24 and version - checkpointed < 10, (version, checkpointed)

    older = tmp_path / "older"
    catalog_at(older).begin_attempt("clicks")
    table = DeltaTable(str(older / "warehouse" / "catalog" / "savepoints"))
    table.alter.set_table_properties({"delta.checkpointInterval": "100"})  # as delta-rs made it
    maintain(catalog_at(older))
    for name in ("savepoints", "streaming_jobs", "shared_state_files"):
        table = DeltaTable(str(older / "warehouse" / "catalog" / name))
        assert CATALOG_TABLE_PROPERTIES.items() <= table.metadata().configuration.items()


def test_the_log_and_its_tombstones_stay_within_their_retention_and_vacuum_finds_the_rest(
    tmp_path, monkeypatch
):
    """What keeps a commit's and an open's cost flat in the history: the log checkpoint holds
    the tombstones of the retention only, the driver's upkeep removes the log entries older
    than the retention that a log checkpoint made unneeded, and maintenance's VACUUM still
    deletes every removed file, those whose tombstones expired included (found by listing).
    The retentions are shortened to a second here; the rows read the same throughout."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from spark_jobs.catalog.upkeep import driver_upkeep
    from state.storage import tables

    monkeypatch.setattr(tables, "LOG_CLEANUP_EVERY_S", 0.0)

    class Sink:  # the driver's sinks: each asked for its own upkeep (cutline/sinks/delta.py)
        upkeeps = 0

        def upkeep(self) -> None:
            self.upkeeps += 1

    catalog = catalog_at(tmp_path)
    attempt = catalog.begin_attempt("clicks")
    table = tmp_path / "warehouse" / "catalog" / "completed_checkpoints"
    log = table / "_delta_log"
    assert (
        CATALOG_TABLE_PROPERTIES.items() <= DeltaTable(str(table)).metadata().configuration.items()
    )
    short = {"delta.logRetentionDuration": "interval 1 seconds"}
    short["delta.deletedFileRetentionDuration"] = "interval 1 seconds"
    DeltaTable(str(table)).alter.set_table_properties(short)

    def complete(cids) -> None:
        for cid in cids:
            catalog.commit_checkpoint(row(cid, attempt))
            if cid > 2:
                catalog.mark_subsumed("clicks", [cid - 2])  # an update: a file removed

    def tombstones() -> list[int]:  # when each file of the latest log checkpoint was removed
        version = json.loads((log / "_last_checkpoint").read_text())["version"]
        actions = pq.read_table(log / f"{version:020d}.checkpoint.parquet").column("remove")
        return [r["deletionTimestamp"] for r in actions.to_pylist() if r is not None]

    complete(range(1, 13))
    assert tombstones()  # within the retention: removed files have their tombstones
    time.sleep(1.5)
    expired_ms = int(time.time() * 1000) - 1000
    complete(range(13, 25))  # a log checkpoint after the expiry drops the old tombstones
    assert all(at > expired_ms for at in tombstones()), tombstones()
    first_entry = min(int(p.name.split(".")[0]) for p in log.glob("*.json"))
    assert first_entry == 0  # a commit does not clean the log (it would list all of it)
    rows = catalog.checkpoints("clicks")
    sink = Sink()
    driver_upkeep(catalog, "clicks", [sink])
    assert sink.upkeeps == 1
    checkpointed = json.loads((log / "_last_checkpoint").read_text())["version"]
    first_entry = min(int(p.name.split(".")[0]) for p in log.glob("*.json"))
    assert 0 < first_entry <= checkpointed  # what the latest log checkpoint needs is kept
    assert catalog.checkpoints("clicks") == rows

    maintain(catalog, vacuum_retention_hours=0)
    on_disk = {str(p.relative_to(table)) for p in table.rglob("*.parquet") if log not in p.parents}
    live = {uri.split(str(table) + "/", 1)[1] for uri in DeltaTable(str(table)).file_uris()}
    assert on_disk == live  # removed files whose tombstones expired are deleted too
    assert catalog.checkpoints("clicks") == rows


def test_a_jobs_many_small_files_are_compacted_and_its_rows_and_fence_stay(root):
    """A driver compacts its job's partitions once they hold 10 data files (one per commit):
    its checkpoint rows into two files, the history below the oldest retained checkpoint (a
    savepoint's row among it) and the retained rows, so that the next subsume's UPDATE rewrites
    the small file only; every row reads the same after, other jobs' partitions and the registry
    are untouched, and the fence still stops an older attempt's commit."""
    import pyarrow as pa

    from spark_jobs.catalog.upkeep import COMPACT_AT, compact_job
    from state.storage.tables import open_table

    catalog = DeltaCatalog(root)
    first = catalog.begin_attempt("clicks")
    second = catalog.begin_attempt("clicks")
    catalog.commit_checkpoint(row(1, second, savepoint=True))
    for cid in range(2, COMPACT_AT):
        catalog.commit_checkpoint(row(cid, second))
    catalog.begin_attempt("other")
    for path in ("a", "b"):  # two appends to the registry: two files, never OPTIMIZEd
        catalog.record_shared_files([{"job_id": "clicks", "path": path, "refcount": 1}])

    def files(table: str, job: str = "clicks") -> int:
        with catalog.latest(table) as dt:
            return len(dt.file_uris(file_pruning_predicate=[("job_id", "=", job)]))

    def checkpoint_files() -> dict[str, tuple[int, int, int]]:
        """Each data file of the job's checkpoint rows: its rows and checkpoint id bounds."""
        table = open_table(catalog.path("completed_checkpoints"))
        adds = pa.table(table.get_add_actions(flatten=True)).to_pydict()
        return {
            path: (n, low, high)
            for path, job, n, low, high in zip(
                adds["path"], adds["partition.job_id"], adds["num_records"],
                adds["min.checkpoint_id"], adds["max.checkpoint_id"], strict=True,
            )
            if job == "clicks"
        }  # fmt: skip

    assert files("completed_checkpoints") == COMPACT_AT - 1
    catalog.mark_subsumed("clicks", [2, 3])  # an update: its rows' files rewritten as one
    assert compact_job(catalog, "clicks") == {}  # below the threshold: nothing rewritten
    cid = COMPACT_AT - 1
    while files("completed_checkpoints") < COMPACT_AT:
        cid += 1
        catalog.commit_checkpoint(row(cid, second))
    rows, jobs = catalog.checkpoints("clicks"), catalog.jobs("clicks")
    before = files("completed_checkpoints")
    assert before >= COMPACT_AT
    assert compact_job(catalog, "clicks") == {"completed_checkpoints": before}
    layout = checkpoint_files()
    assert sorted(layout.values()) == [(3, 1, 3), (cid - 3, 4, cid)]
    assert catalog.checkpoints("clicks") == rows and catalog.jobs("clicks") == jobs
    assert files("streaming_jobs", "other") == 1 and files("shared_state_files") == 2

    catalog.mark_subsumed("clicks", [4])  # the next subsume: the history's file stays as it is
    history = next(path for path, (_, low, _) in layout.items() if low == 1)
    assert history in checkpoint_files() and len(checkpoint_files()) == 2
    assert catalog.checkpoints("clicks", (CheckpointStatus.SUBSUMED,))[-1].checkpoint_id == 4
    with pytest.raises(FencedError, match="attempt 1 of clicks is fenced"):
        catalog.commit_checkpoint(row(cid + 1, first))
    catalog.commit_checkpoint(row(cid + 1, second))
    assert [r.checkpoint_id for r in catalog.checkpoints("clicks")][-1] == cid + 1
