"""Keeping the catalog's tables small as commits add files, so that reading a job's rows costs
the same on its thousandth checkpoint as on its tenth.

Every append and every update adds a data file to the job's partition, and a read of the job's
rows opens each of them. A running driver, from its heartbeat thread (:func:`driver_upkeep`),
compacts its own job's partitions once they hold :data:`COMPACT_AT` files (:func:`compact_job`)
and every five minutes removes the expired log entries of the catalog's tables and of its sinks'
(no commit does: ``TABLE_PROPERTIES``); orchestration's scheduled maintenance (:func:`maintain`)
compacts every table, removes files no version within the retention needs and writes a log
checkpoint.

``shared_state_files`` is compacted by GC's own rewrite (every row rewritten, none changed), not
by OPTIMIZE: OPTIMIZE's removes say the data did not change, so a GC rewrite planned before it
would commit its removes of files OPTIMIZE had already replaced and leave their rows twice.
Rewrites conflict with each other, and the loser is planned again (shared_files.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from cutline.sinks import SinkWriter
from spark_jobs.catalog.data_files import check_protocol, job_files, read_rows, replace_files
from spark_jobs.catalog.delta_catalog import DeltaCatalog, is_conflict
from spark_jobs.catalog.shared_files import TABLE as REGISTRY
from spark_jobs.catalog.shared_files import every_row
from spark_jobs.catalog.tables import CATALOG_TABLE_PROPERTIES, TABLES
from state.catalog import CheckpointStatus
from state.storage import open_storage
from state.storage.tables import open_table

COMPACT_AT = 10  # data files in one job's partition of a table that make its driver compact it
COMPACTED = tuple(name for name in TABLES if name != REGISTRY)  # what a driver compacts
CHECKPOINTS = "completed_checkpoints"


def driver_upkeep(
    catalog: DeltaCatalog, job_id: str, sinks: Iterable[SinkWriter] = ()
) -> dict[str, int]:
    """A running driver's upkeep after each heartbeat: the expired log entries of the catalog's
    tables and of ``sinks``' removed (each at most every five minutes), then
    :func:`compact_job`, whose result it returns."""
    catalog.clean_logs()
    for sink in sinks:
        sink.upkeep()
    return compact_job(catalog, job_id)


def compact_job(catalog: DeltaCatalog, job_id: str, min_files: int = COMPACT_AT) -> dict[str, int]:
    """Compact ``job_id``'s partition of each table but the registry where it holds at least
    ``min_files`` data files: its checkpoint rows into two files (:func:`compact_checkpoints`),
    the others into one; returns the files each compaction replaced. A compaction that lost to
    another writer's commit is left to the next call."""
    replaced = {}
    for name in COMPACTED:
        try:
            files = _compact(catalog, name, job_id, min_files)
        except Exception as e:
            if not is_conflict(e):
                raise
            continue
        if files:
            replaced[name] = files
    return replaced


def _compact(catalog: DeltaCatalog, name: str, job_id: str, min_files: int) -> int:
    """Compact ``job_id``'s partition of table ``name`` if it holds ``min_files`` data files or
    more; returns how many it replaced (0: none). Raises a commit conflict."""
    partition = [("job_id", "=", job_id)]
    with catalog.latest(name) as dt:
        files = len(dt.file_uris(file_pruning_predicate=partition))
        if files < min_files:
            return 0
        if name == CHECKPOINTS:
            compact_checkpoints(catalog, dt, job_id)
            return files
        return int(dt.optimize.compact(partition_filters=partition)["numFilesRemoved"])


def compact_checkpoints(catalog: DeltaCatalog, dt, job_id: str) -> None:
    """Rewrite ``job_id``'s rows of ``completed_checkpoints`` in ``dt``'s version (the table,
    loaded) as two files: its history, every row below its oldest retained checkpoint, and the
    rest. Each checkpoint's commit marks the oldest retained checkpoint SUBSUMED with an UPDATE,
    which rewrites the files holding that row: this way never the history, which only grows,
    so a commit costs the same after ten thousand checkpoints as after ten. Raises a commit
    conflict when a concurrent commit removed one of the files read."""
    check_protocol(dt, CHECKPOINTS)
    files = job_files(dt, job_id)
    storage = open_storage(catalog.path(CHECKPOINTS))
    rows = [row for name in files for row in read_rows(storage, CHECKPOINTS, name, job_id)]
    rows.sort(key=lambda r: r["checkpoint_id"])
    retained = (
        r["checkpoint_id"]
        for r in rows
        if r["status"] == CheckpointStatus.COMPLETED.value and not r["savepoint"]
    )
    first = min(retained, default=None)
    cut = len(rows) if first is None else sum(r["checkpoint_id"] < first for r in rows)
    summary = f"cutline compaction: {job_id}'s {cut} checkpoints of history apart"
    replace_files(dt, storage, CHECKPOINTS, job_id, files, [rows[:cut], rows[cut:]], summary)


def maintain(catalog: DeltaCatalog, vacuum_retention_hours: float = 168.0) -> dict[str, int]:
    """Compact every catalog table (the registry by GC's rewrite, the checkpoints by
    :func:`compact_checkpoints`), remove files no version within ``vacuum_retention_hours``
    needs (a full VACUUM: the files no log entry within the tombstone retention names are found
    by listing), write a log checkpoint and remove the log entries it made unneeded; tables made
    before ``CATALOG_TABLE_PROPERTIES`` get them.
    Returns each table's data file count after."""
    counts = {}
    for name in TABLES:
        if name == REGISTRY:
            for job_id in _partitions(catalog, name):
                catalog.update_shared_files(job_id, every_row)
        elif name == CHECKPOINTS:  # each job's history apart from its retained checkpoints
            for job_id in _partitions(catalog, name):
                catalog.retrying(lambda j=job_id: _compact(catalog, CHECKPOINTS, j, 1))
        else:
            catalog.retrying(lambda n=name: open_table(catalog.path(n)).optimize.compact())
        table = open_table(catalog.path(name))
        if not CATALOG_TABLE_PROPERTIES.items() <= table.metadata().configuration.items():
            table.alter.set_table_properties(CATALOG_TABLE_PROPERTIES)  # made before them
        table.vacuum(
            retention_hours=int(vacuum_retention_hours),
            enforce_retention_duration=False,
            dry_run=False,
            full=True,
        )
        table.create_checkpoint()
        table.cleanup_metadata()
        counts[name] = len(open_table(catalog.path(name)).file_uris())
    return counts


def _partitions(catalog: DeltaCatalog, table: str) -> list[str]:
    """The jobs with rows in ``table``."""
    adds = open_table(catalog.path(table)).get_add_actions(flatten=True)
    return sorted(set(adds.column("partition.job_id").to_pylist()) - {None})
