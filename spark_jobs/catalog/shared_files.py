"""Retention GC's writes of ``shared_state_files``: commits that a running job's appends cannot
make fail (docs/design.md, section 9).

Why not a MERGE. Delta Lake on Spark has one isolation level, Serializable (its
``delta.isolationLevel`` accepts nothing else), under which a transaction that read a partition
conflicts with any file a concurrent commit added to it, a blind append included. A MERGE into
``shared_state_files`` reads the job's whole partition (its condition's only partition predicate
is ``job_id``), and the running job appends the new shared files of every checkpoint to that
partition: a MERGE that takes seconds kept losing to a job that checkpoints every second.

How instead (:func:`rewrite_rows`). A rewrite is planned on one table version: it reads the
data files of the job's partition in that version, asks ``plan`` for the changes, writes the
rows of the files that hold a changed row (changed) and the new rows to fresh files, and commits
with delta-rs: remove exactly those files, add the fresh ones, under no read predicate. A commit
that only added files (the job's registrations) therefore never conflicts with it; delta-rs
rebases the commit over it. A commit that removed files (another pass's rewrite, OPTIMIZE) does:
then the rewrite is planned again, on the new version, from the rows as they are now. Nor can a
rewrite fail the job's appends: a blind append reads nothing, so only a change of the table's
metadata or protocol conflicts with it, and a rewrite makes none.

The files are read and written as Parquet directly (data_files.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spark_jobs.catalog.data_files import check_protocol, job_files, read_rows, replace_files
from state.storage import open_storage
from state.storage.tables import open_table

TABLE = "shared_state_files"
TRIES = 40
LIVE = "LIVE"
SUMMARY = "cutline gc: "  # how a rewrite's commit info (userMetadata) begins


@dataclass(frozen=True)
class RegistryChanges:
    """What a rewrite changes in one job's rows: new values of some columns, by path (every
    row with that path), and rows to add."""

    updates: dict[str, dict[str, Any]] = field(default_factory=dict)
    inserts: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.updates or self.inserts)


@dataclass(frozen=True)
class RewriteResult:
    """A rewrite that landed (``committed`` False: there was nothing to change)."""

    committed: bool
    rows_changed: int
    rows_added: int
    files_removed: int
    conflicts: int  # plans discarded because a concurrent commit removed files they read


def every_row(rows: list[dict[str, Any]]) -> RegistryChanges:
    """A plan that touches every row and changes none: the job's data files rewritten as at
    most two (LIVE rows, the rest), a compaction that conflicts as any rewrite does."""
    return RegistryChanges({row["path"]: {} for row in rows})


def rewrite_rows(
    table_path: str | Path,
    job_id: str,
    plan: Callable[[list[dict[str, Any]]], RegistryChanges],
    *,
    tries: int = TRIES,
) -> RewriteResult:
    """Apply ``plan(rows)`` to ``job_id``'s rows of ``shared_state_files`` in one commit that no
    concurrent append can fail (see the module docstring). ``plan`` receives the job's rows as
    of one table version and may run more than once: once per version the rewrite is planned on.
    Raises ``RuntimeError`` after ``tries`` plans that all lost to removing commits."""
    from deltalake.exceptions import CommitFailedError

    conflicts = 0
    for attempt in range(tries):
        try:
            result = _rewrite_once(str(table_path), job_id, plan)
        except CommitFailedError:
            conflicts += 1
            time.sleep(min(1.0, 0.02 * 2**attempt) * random.uniform(0.5, 1.5))
            continue
        return replace(result, conflicts=conflicts)
    raise RuntimeError(
        f"{TABLE}: no rewrite of {job_id}'s rows landed in {tries} plans (each lost to a "
        "concurrent commit that removed files it read)"
    )


def _rewrite_once(
    root: str, job_id: str, plan: Callable[[list[dict[str, Any]]], RegistryChanges]
) -> RewriteResult:
    """One plan and its commit, on the table's current version. Raises ``CommitFailedError``
    if a commit since that version removed files (nothing of this plan stays behind)."""
    dt = open_table(root)
    check_protocol(dt, TABLE)
    files = job_files(dt, job_id)
    storage = open_storage(root)
    by_file = {name: read_rows(storage, TABLE, name, job_id) for name in files}
    changes = plan([row for rows in by_file.values() for row in rows])
    if not changes:
        return RewriteResult(False, 0, 0, 0, 0)
    touched = {
        name: rows
        for name, rows in by_file.items()
        if any(row["path"] in changes.updates for row in rows)
    }
    kept: list[dict[str, Any]] = []
    changed = 0
    for rows in touched.values():
        for row in rows:
            update = changes.updates.get(row["path"])
            changed += update is not None
            kept.append({**row, **update} if update else row)
    kept += [{**row, "job_id": job_id} for row in changes.inserts]
    # LIVE rows change again in later passes, DELETED ones never: apart, the files holding only
    # DELETED rows are never rewritten again
    kept.sort(key=lambda r: r["path"])
    live = [r for r in kept if r["status"] == LIVE]
    done = [r for r in kept if r["status"] != LIVE]
    summary = f"{SUMMARY}{changed} rows of {job_id} changed, {len(changes.inserts)} added"
    replace_files(dt, storage, TABLE, job_id, {n: files[n] for n in touched}, [live, done], summary)
    return RewriteResult(True, changed, len(changes.inserts), len(touched), 0)
