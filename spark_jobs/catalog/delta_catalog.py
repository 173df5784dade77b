"""The catalog on Delta tables (docs/design.md): `state.catalog.JobCatalog` for the runtime.

Every read and every commit goes through delta-rs (``deltalake``): no Spark job, so a driver plans
its start while its JVM starts, and the CLI, the sensors, GC and the Dagster maintenance jobs
need no Spark session. One commit protocol for every writer is also what makes the catalog safe
on S3 with writers in many processes (state/storage/tables.py). GC's registry updates are file
rewrites that the running job's appends of new shared files cannot fail (shared_files.py).

Conditional commits. The writes that decide something (which attempt a starter gets, whether a
checkpoint of an attempt may complete) are compare-and-swap commits: planned on one version of
the table, committed with no retry, so a commit that another writer got in before fails and is
planned again on the new version (:meth:`DeltaCatalog._cas_commit`). Two starters can therefore
never get the same attempt number.

Fencing. ``completed_checkpoints`` records the Delta app transaction ``cutline-<job>`` with version
``attempt << 32 | checkpoint_id``. A starting attempt *a* first commits version ``a << 32``; a
checkpoint commit of attempt *b* is planned only if the recorded version's attempt is not above
*b*, so once *a* has started no older attempt can complete a checkpoint (:class:`FencedError`).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from spark_jobs.catalog.shared_files import (
    RegistryChanges,
    RewriteResult,
    rewrite_rows,
)
from spark_jobs.catalog.tables import (
    CATALOG_TABLE_PROPERTIES,
    TABLES,
    CatalogReader,
    arrow_schema,
    now_ms,
    read_delta,
    rs_literal,
)
from spark_jobs.errors import failure_summary
from state.catalog import CheckpointStatus, CompletedCheckpoint, FencedError, JobCatalog
from state.storage.tables import (
    COMMIT_TOKEN,
    committed_since,
    find_table,
    storage_options,
    table_uri,
    write_table,
)

_ATTEMPT_SHIFT = 32
_UPDATE_TRIES = 10
_CAS_TRIES = 40  # conditional commits lose to any concurrent commit of the table
_EXISTING: set[str] = set()  # catalog roots whose tables this process saw (never dropped)


def _each_table(load: Callable[[str], bool]) -> list[bool]:
    """``load`` of every catalog table at once, in :data:`TABLES`' order: on object storage a
    table's load is a few round trips (its log checkpoint, a listing, its commits), and the
    tables' loads need not wait for each other."""
    with ThreadPoolExecutor(len(TABLES), thread_name_prefix="cutline-catalog") as pool:
        return list(pool.map(load, TABLES))


def is_conflict(error: BaseException) -> bool:
    """Whether ``error`` is a Delta commit conflict (another writer committed first)."""
    from deltalake.exceptions import CommitFailedError

    return isinstance(error, CommitFailedError)


def _checkpoint_row(checkpoint: CompletedCheckpoint) -> dict[str, Any]:
    row = checkpoint.to_dict()
    row["source_positions"] = json.dumps(checkpoint.source_positions, sort_keys=True)
    return row


class DeltaCatalog(CatalogReader, JobCatalog):
    """The four catalog tables under the catalog root (a local path or an ``s3://`` URL),
    created if missing, read and committed with delta-rs alone: every writer of every process
    commits the same way, which is what makes concurrent commits on S3 safe
    (state/storage/tables.py). Thread-safe."""

    def __init__(self, root: str | Path) -> None:
        super().__init__(root)
        self._lock = threading.RLock()
        self.conflicts_retried = 0  # writes done again after a concurrent commit conflicted
        self._ensure_tables()

    @staticmethod
    def tables_exist(root: str | Path) -> bool:
        """Every catalog table exists under the catalog root ``root`` (looked up once per
        process: a start opens the catalog twice, GC checks and opens it)."""
        if str(root) not in _EXISTING and all(
            _each_table(lambda name: find_table(table_uri(root, name)) is not None)
        ):
            _EXISTING.add(str(root))
        return str(root) in _EXISTING

    def _ensure_tables(self) -> None:
        """Create missing tables. Drivers of several jobs may race to create them on a fresh
        catalog: losing that race is fine as long as the table exists afterwards."""
        from deltalake import DeltaTable

        if self.root in _EXISTING:
            return

        def found(name: str) -> bool:  # loaded into the handle the reads and commits use next
            with self.handle(name).find() as table:
                return table is not None

        missing = [
            name for name, there in zip(TABLES, _each_table(found), strict=True) if not there
        ]
        if not missing:
            _EXISTING.add(self.root)
        for name in missing:
            uri = self.path(name)
            try:
                DeltaTable.create(
                    uri,
                    schema=arrow_schema(name),
                    partition_by=["job_id"],
                    mode="ignore",
                    storage_options=storage_options(uri),
                    configuration=CATALOG_TABLE_PROPERTIES,
                )
            except Exception:
                if find_table(uri) is None:
                    raise

    # -- writes ------------------------------------------------------------------------------

    def _append(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` exactly once: a blind append, committed as :meth:`_cas_commit` does
        (so a commit whose answer was lost is not made again), planned again on every version
        another writer got in first."""
        if rows:
            self._cas_commit(table, lambda dt: (rows, [], None))

    def _cas_commit(self, table: str, plan) -> Any:
        """A compare-and-swap append: ``plan(dt)`` looks at ``table`` as of one version (a
        ``deltalake.DeltaTable``) and returns ``(rows, app transactions, result)`` or raises to
        refuse; the rows are committed only on that version. When another writer committed
        first, the commit fails and is planned again on the new version. Returns ``result``.

        A commit that landed although its writer was told otherwise (object storage stored the
        log entry and the answer was lost; the retry then found the entry taken) is recognised
        by the token its commit info carries, and is not made again."""
        import pyarrow as pa
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError

        for tries in range(_CAS_TRIES):
            with self._lock, self.latest(table) as dt:
                rows, transactions, result = plan(dt)
                token = uuid.uuid4().hex
                commit = CommitProperties(
                    max_commit_retries=0,
                    app_transactions=[Transaction(app, v) for app, v in transactions] or None,
                    custom_metadata={COMMIT_TOKEN: token},
                )
                try:
                    write_table(
                        dt,
                        pa.Table.from_pylist(rows, schema=arrow_schema(table)),
                        mode="append",
                        schema_mode="merge",
                        commit_properties=commit,
                    )
                    return result
                except CommitFailedError:
                    if committed_since(self.path(table), dt.version(), token):
                        return result
            time.sleep(min(2.0, 0.02 * 2**tries) * random.uniform(0.5, 1.5))
        raise RuntimeError(f"{table}: no conditional commit landed in {_CAS_TRIES} tries")

    def _fence_app(self, job_id: str) -> str:
        return f"cutline-{job_id}"

    def begin_attempt(
        self,
        job_id: str,
        run_id: str = "",
        restored_from: int | None = None,
        checkpoint_root: str = "",
    ) -> int:
        """A new attempt that fences every older one. Its number is allocated by a conditional
        commit of its ``streaming_jobs`` row, so two starters never share one; then the fencing
        commit (raises :class:`FencedError` if a newer attempt fenced first: two starters raced
        and this one lost). Older attempts still marked RUNNING (their driver died without
        saying so, or lives on as a zombie that the fence stops) become LOST."""

        def allocate(dt):
            previous = read_delta(dt, job_id, ["attempt"]).column("attempt").to_pylist()
            attempt = max(previous, default=0) + 1
            row = {
                "job_id": job_id,
                "attempt": attempt,
                "run_id": run_id,
                "status": "RUNNING",
                "started_ms": now_ms(),
                "restored_from": restored_from,
                "last_heartbeat_ms": now_ms(),
                "checkpoint_root": checkpoint_root,
            }
            return [row], [], attempt

        attempt = self._cas_commit("streaming_jobs", allocate)
        app, version = self._fence_app(job_id), attempt << _ATTEMPT_SHIFT

        def fence(dt):
            recorded = dt.transaction_version(app) or 0
            if recorded >> _ATTEMPT_SHIFT > attempt:
                raise FencedError(
                    f"attempt {attempt} of {job_id} was superseded by attempt "
                    f"{recorded >> _ATTEMPT_SHIFT} before it started"
                )
            return [], [(app, max(recorded, version))], None

        try:
            self._cas_commit("completed_checkpoints", fence)
        except FencedError as e:
            self.set_job_status(job_id, attempt, "SUPERSEDED", str(e))
            raise
        lost = [
            r["attempt"]
            for r in self.jobs(job_id)
            if r["status"] == "RUNNING" and r["attempt"] < attempt
        ]
        if lost:
            self._rs_update(
                "streaming_jobs",
                f"job_id = {rs_literal(job_id)} AND attempt IN ({','.join(map(str, lost))})",
                status="LOST",
                ended_ms=now_ms(),
                failure_reason=f"superseded by attempt {attempt} while marked RUNNING",
            )
        return attempt

    def newest_attempt(self, job_id: str) -> int:
        """The highest attempt number of ``job_id`` that has begun (0 if none)."""
        return max((r["attempt"] for r in self.jobs(job_id)), default=0)

    def import_checkpoints(self, checkpoints: list[CompletedCheckpoint]) -> None:
        """Load checkpoint rows as they are, in one unfenced commit (rebuilding a catalog from
        manifests, benchmarks); never beside a running attempt of the same job."""
        self._append("completed_checkpoints", [_checkpoint_row(c) for c in checkpoints])

    def commit_checkpoint(self, checkpoint: CompletedCheckpoint) -> None:
        """Record ``checkpoint`` as COMPLETED, conditionally: only while no newer attempt of its
        job has started (else :class:`FencedError`)."""
        app = self._fence_app(checkpoint.job_id)
        version = (checkpoint.attempt << _ATTEMPT_SHIFT) | checkpoint.checkpoint_id

        def plan(dt):
            recorded = dt.transaction_version(app) or 0
            if recorded >> _ATTEMPT_SHIFT > checkpoint.attempt:
                raise FencedError(
                    f"attempt {checkpoint.attempt} of {checkpoint.job_id} is fenced: attempt "
                    f"{recorded >> _ATTEMPT_SHIFT} started, so checkpoint "
                    f"{checkpoint.checkpoint_id} was not committed"
                )
            return [_checkpoint_row(checkpoint)], [(app, max(recorded, version))], None

        self._cas_commit("completed_checkpoints", plan)

    def _set_status(self, job_id: str, ids: Iterable[int], status: CheckpointStatus) -> None:
        ids = sorted(set(ids))
        if ids:
            self._rs_update(
                "completed_checkpoints",
                f"job_id = {rs_literal(job_id)} AND checkpoint_id IN ({','.join(map(str, ids))})",
                status=status.value,
            )

    def mark_subsumed(self, job_id: str, checkpoint_ids: list[int]) -> None:
        self._set_status(job_id, checkpoint_ids, CheckpointStatus.SUBSUMED)

    def mark_corrupt(self, job_id: str, checkpoint_id: int, reason: str) -> None:
        self._set_status(job_id, [checkpoint_id], CheckpointStatus.CORRUPT)

    def retrying(self, action) -> None:
        """Run a read-modify-write ``action``, again when a concurrent writer's commit conflicts
        with it (Delta's optimistic concurrency; tables are partitioned by job, so only writers
        of the same job conflict, such as a new attempt and its predecessor's last heartbeat).
        Backoff with jitter, so two retrying writers do not collide again in step. Counts the
        retries in :attr:`conflicts_retried`."""
        for attempt in range(_UPDATE_TRIES):
            try:
                with self._lock:
                    action()
                return
            except Exception as e:
                if not is_conflict(e) or attempt == _UPDATE_TRIES - 1:
                    raise
                self.conflicts_retried += 1
                time.sleep(min(5.0, 0.1 * 2**attempt) * random.uniform(0.5, 1.5))

    def _rs_update(self, table: str, condition: str, **values: str | int | None) -> None:
        """Set columns of the rows of ``table`` matching ``condition`` (delta-rs SQL; no Spark)."""
        from deltalake import CommitProperties
        from deltalake.exceptions import CommitFailedError

        updates = {column: rs_literal(value) for column, value in values.items()}

        def update() -> None:
            token = uuid.uuid4().hex
            properties = CommitProperties(custom_metadata={COMMIT_TOKEN: token})
            planned_on = -1
            try:
                with self.latest(table) as dt:
                    planned_on = dt.version()
                    dt.update(updates=updates, predicate=condition, commit_properties=properties)
            except CommitFailedError:
                if not committed_since(self.path(table), planned_on, token):
                    raise  # (a commit whose answer was lost is this update's: it is done)

        self.retrying(update)

    def _update_attempt(self, job_id: str, attempt: int, **values: str | int | None) -> None:
        condition = f"job_id = {rs_literal(job_id)} AND attempt = {int(attempt)}"
        self._rs_update("streaming_jobs", condition, **values)

    def set_job_status(self, job_id: str, attempt: int, status: str, reason: str = "") -> None:
        """End the attempt with ``status``; ``reason`` is kept as one clean line
        (``failure_summary``: the full trace is in the run's log)."""
        self._update_attempt(
            job_id,
            attempt,
            status=status,
            ended_ms=now_ms(),
            failure_reason=failure_summary(reason),
        )

    def set_restored(
        self, job_id: str, attempt: int, restored_from: int | None, allocation: dict[str, str]
    ) -> None:
        """Record what the attempt restored and which host holds each subtask's state (for
        allocation-preserving restores)."""
        self._update_attempt(
            job_id,
            attempt,
            restored_from=restored_from,
            allocation=json.dumps(allocation, sort_keys=True),
            last_heartbeat_ms=now_ms(),
        )

    def heartbeat(self, job_id: str, attempt: int) -> None:
        """The attempt's driver is alive (``last_heartbeat_ms`` = now)."""
        self._update_attempt(job_id, attempt, last_heartbeat_ms=now_ms())

    def record_recovery(self, row: dict[str, Any]) -> None:
        self._append("recoveries", [row])  # schema merged: tables from before a new column

    def record_savepoint(self, row: dict[str, Any]) -> None:
        self._append("savepoints", [row])

    def set_savepoint_status(self, job_id: str, location: str, status: str) -> None:
        condition = f"job_id = {rs_literal(job_id)} AND location = {rs_literal(location)}"
        self._rs_update("savepoints", condition, status=status)

    def record_shared_files(self, rows: list[dict[str, Any]]) -> None:
        self._append("shared_state_files", rows)

    def update_shared_files(
        self, job_id: str, plan: Callable[[list[dict[str, Any]]], RegistryChanges]
    ) -> RewriteResult:
        """Change ``job_id``'s rows of ``shared_state_files`` as ``plan(rows)`` says, in one
        commit that the running job's appends cannot fail: planned on one version of the table,
        planned again when a concurrent commit removed files it read (spark_jobs/catalog/
        shared_files.py). Runs no Spark job."""
        with self._lock:
            return rewrite_rows(self.path("shared_state_files"), job_id, plan)
