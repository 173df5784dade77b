"""The catalog's tables (docs/design.md, section 8) and reading them with delta-rs: no Spark
job, so the CLI, the sensors and a driver's start read the catalog while a JVM starts or without
one. The writer is spark_jobs/catalog/delta_catalog.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from state.catalog import CheckpointStatus, CompletedCheckpoint
from state.storage.tables import TABLE_PROPERTIES, LatestTable, open_table, table_uri

# The catalog's tables' own properties, which keep each commit's and each open's cost flat in
# the history: besides every table's (``TABLE_PROPERTIES``: no commit lists the whole log), an
# hour of log (a driver's upkeep cleans it, spark_jobs/catalog/upkeep.py) and an hour of
# tombstones in each log checkpoint, which every cold open reads and every tenth commit rewrites
# (Delta's default is a week: every compaction's and every status update's removed files). An
# hour covers any reader of an older version; maintenance's VACUUM runs in full mode, so files
# whose tombstones expired are found by listing.
CATALOG_TABLE_PROPERTIES = {
    **TABLE_PROPERTIES,
    "delta.logRetentionDuration": "interval 1 hours",
    "delta.deletedFileRetentionDuration": "interval 1 hours",
}

TABLES: dict[str, str] = {
    "streaming_jobs": (
        "job_id string, attempt int, run_id string, status string, started_ms long, "
        "ended_ms long, restored_from long, allocation string, last_heartbeat_ms long, "
        "failure_reason string, checkpoint_root string"
    ),
    "completed_checkpoints": (
        "job_id string, checkpoint_id long, batch_id long, attempt int, trigger_time_ms long, "
        "complete_time_ms long, source_positions string, metadata_path string, full_size long, "
        "incremental_size long, file_count int, sync_ms double, async_ms double, status string, "
        "savepoint boolean"
    ),
    "shared_state_files": (
        "job_id string, path string, operator string, subtask int, size long, created_by long, "
        "last_used long, refcount int, status string, deleted_at_ms long"
    ),
    "recoveries": (
        "job_id string, attempt int, checkpoint_id long, subtasks_local int, subtasks_remote int, "
        "bytes_local long, bytes_remote long, duration_ms double, fallbacks string, hints string, "
        "recovered_at_ms long, files_local int, files_remote int, placement string"
    ),
    "savepoints": (
        "job_id string, request_id string, location string, checkpoint_id long, batch_id long, "
        "size long, file_count int, code_version string, parallelism int, created_ms long, "
        "copy_ms double, stopped boolean, status string, reason string"
    ),
}

_ARROW_TYPES = {
    "string": "string",
    "int": "int32",
    "long": "int64",
    "double": "float64",
    "boolean": "bool",
}


def now_ms() -> int:
    return int(time.time() * 1000)


def arrow_schema(table: str):
    """The pyarrow schema of a catalog table (from its DDL in :data:`TABLES`)."""
    import pyarrow as pa

    fields = [column.split() for column in TABLES[table].split(", ")]
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in fields])


def rs_literal(value: str | int | None) -> str:
    """A delta-rs (DataFusion) SQL literal: standard strings, where a backslash is itself."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(int(value))


def read_delta(
    table: str | Path | Any,
    job_id: str | None = None,
    columns: list[str] | None = None,
    where: str | None = None,
):
    """A Delta table (a URI or path, or a ``deltalake.DeltaTable`` at the version it was loaded
    at), or
    one job's rows of it (and of those, the ones the SQL condition ``where`` holds for), as a
    pyarrow Table (delta-rs; no Spark).

    Read through delta-rs's own query engine, not ``DeltaTable.to_pyarrow_table``: the latter's
    pyarrow dataset makes about every other interpreter abort at exit ("terminate called without
    an active exception"; delta-rs#2184), which turns a CLI command's exit code into 134.
    """
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    select = ", ".join(f'"{c}"' for c in columns) if columns else "*"
    conditions = [f"job_id = {rs_literal(job_id)}"] if job_id is not None else []
    conditions += [where] if where else []
    condition = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    loaded = table if isinstance(table, DeltaTable) else open_table(table)
    query = QueryBuilder().register("t", loaded)
    return pa.table(query.execute(f"SELECT {select} FROM t{condition}").read_all())


class CatalogReader:
    """Read-only access to the catalog tables under the catalog root (a local path or an
    ``s3://`` URL) with delta-rs: no Spark needed (CLI, sensors). Each table stays loaded for
    the reader's life and is brought up to date before each read, so a read costs the same
    however long the table's history (:class:`~state.storage.tables.LatestTable`)."""

    def __init__(self, root: str | Path) -> None:
        self.root = str(root)
        self._tables: dict[str, LatestTable] = {}
        self._tables_lock = threading.Lock()
        # each table's reads at its newest version seen: (version, {query: rows}); a version
        # names one snapshot, so a read repeated before the next commit costs no data read
        self._reads: dict[str, tuple[int, dict[tuple, list[dict[str, Any]]]]] = {}

    def path(self, table: str) -> str:
        return table_uri(self.root, table)

    def handle(self, table: str) -> LatestTable:
        """The reader's handle of ``table``, kept loaded for its life."""
        with self._tables_lock:
            if table not in self._tables:
                self._tables[table] = LatestTable(self.path(table))
            return self._tables[table]

    @contextmanager
    def latest(self, table: str) -> Iterator[Any]:
        """``table`` (a ``deltalake.DeltaTable``) at its newest version for the ``with``
        block; raises ``TableNotFoundError`` if it does not exist."""
        with self.handle(table).latest() as dt:
            yield dt

    def clean_logs(self) -> None:
        """Remove each table's expired log entries, at most once per
        ``LOG_CLEANUP_EVERY_S`` (``LatestTable.clean_log``)."""
        for name in TABLES:
            self.handle(name).clean_log()

    def _read(
        self, table: str, job_id: str, columns: list[str] | None = None, where: str | None = None
    ) -> list[dict[str, Any]]:
        from deltalake.exceptions import TableNotFoundError

        query = (job_id, tuple(columns or ()), where)
        try:
            with self.latest(table) as dt:
                version, reads = self._reads.get(table, (-1, {}))
                if version != dt.version():
                    version, reads = dt.version(), {}
                    self._reads[table] = (version, reads)
                if query not in reads:
                    reads[query] = read_delta(dt, job_id, columns, where).to_pylist()
                rows = reads[query]
        except TableNotFoundError:
            return []
        return [dict(r) for r in rows]

    def job_ids(self) -> list[str]:
        """Every job with an attempt in the catalog (none without a catalog)."""
        from deltalake.exceptions import TableNotFoundError

        try:
            with self.latest("streaming_jobs") as dt:
                data = read_delta(dt, None, ["job_id"])
        except TableNotFoundError:
            return []
        return sorted(set(data.column("job_id").to_pylist()))

    def jobs(self, job_id: str) -> list[dict[str, Any]]:
        return sorted(self._read("streaming_jobs", job_id), key=lambda r: r["attempt"])

    def allocation(self, job_id: str, run_id: str | None = None) -> dict[str, str]:
        """The subtask -> host allocation of the newest attempt that recorded one (of the
        orchestrator's run ``run_id``, if one of its attempts did): where a restore finds each
        subtask's local copy. Empty if no attempt recorded one."""
        attempts = [r for r in self.jobs(job_id) if r["allocation"]]
        mine = [r for r in attempts if r["run_id"] == run_id] or attempts[-1:]
        return json.loads(mine[-1]["allocation"]) if mine else {}

    def shared_files(self, job_id: str) -> list[dict[str, Any]]:
        return sorted(self._read("shared_state_files", job_id), key=lambda r: r["path"])

    def recoveries(self, job_id: str) -> list[dict[str, Any]]:
        return sorted(self._read("recoveries", job_id), key=lambda r: r["recovered_at_ms"])

    def savepoints(self, job_id: str) -> list[dict[str, Any]]:
        """The job's savepoints (and requests that failed), oldest first."""
        return sorted(self._read("savepoints", job_id), key=lambda r: r["created_ms"])

    def checkpoints(
        self, job_id: str, statuses: tuple[CheckpointStatus, ...] | None = None
    ) -> list[CompletedCheckpoint]:
        """The job's checkpoint rows, ascending by id; with ``statuses``, only those rows are
        read (the retained ones of a long history, not all of it)."""
        where = None
        if statuses is not None:
            where = f"status IN ({', '.join(rs_literal(s.value) for s in statuses)})"
        out = []
        for r in self._read("completed_checkpoints", job_id, where=where):
            status = CheckpointStatus(r.pop("status"))
            r["source_positions"] = json.loads(r["source_positions"] or "{}")
            out.append(CompletedCheckpoint(status=status, **r))
        return sorted(out, key=lambda c: c.checkpoint_id)

    def newest_checkpoint_id(self, job_id: str) -> int:
        """The highest checkpoint id of the job in any status (0 if none)."""
        rows = self._read("completed_checkpoints", job_id, ["checkpoint_id"])
        return max((r["checkpoint_id"] for r in rows), default=0)
