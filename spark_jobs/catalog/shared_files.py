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

The data files are read as Parquet directly, which is right only for tables without deletion
vectors or column mapping (reader version 1), as the catalog creates them; a table that needs
more is refused, not misread.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from spark_jobs.catalog.tables import arrow_schema
from state.storage import DurableStorage, open_storage
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
    from deltalake import CommitProperties
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, RemoveAction

    dt = open_table(root)
    _check_protocol(dt)
    files = _job_files(dt, job_id)
    storage = open_storage(root)
    by_file = {name: _read_rows(storage, name, job_id) for name in files}
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
    live = [r for r in kept if r["status"] == LIVE]
    done = [r for r in kept if r["status"] != LIVE]
    written = [_write_file(storage, rows) for rows in (live, done) if rows]
    now = int(time.time() * 1000)
    actions = [RemoveAction(name, True, now, files[name], {"job_id": job_id}) for name in touched]
    actions += [
        AddAction(name, size, {"job_id": job_id}, mtime, True, json.dumps({"numRecords": n}))
        for name, size, mtime, n in written
    ]
    summary = f"{SUMMARY}{changed} rows of {job_id} changed, {len(changes.inserts)} added"
    info = {"isBlindAppend": False, "readVersion": dt.version(), "userMetadata": summary}
    commit = CommitProperties(custom_metadata=info)
    try:
        dt.create_write_transaction(
            actions, mode="append", schema=dt.schema(), partition_by=["job_id"],
            commit_properties=commit,
        )  # fmt: skip
    except CommitFailedError:
        current = _job_files(open_table(root), job_id)
        storage.delete_many(name for name, *_ in written if name not in current)
        raise  # (the files not committed are removed: nothing refers to them)
    return RewriteResult(True, changed, len(changes.inserts), len(touched), 0)


def _check_protocol(dt) -> None:
    protocol = dt.protocol()
    if protocol.min_reader_version > 1:
        raise RuntimeError(
            f"{TABLE} needs reader version {protocol.min_reader_version} (features "
            f"{protocol.reader_features}); GC's registry rewrite reads its data files as plain "
            "Parquet, which is right only for reader version 1"
        )


def _job_files(dt, job_id: str) -> dict[str, int]:
    """The data files (path in the log -> size) of the job's partition in ``dt``'s version."""
    import pyarrow as pa

    adds = pa.table(dt.get_add_actions(flatten=True))
    names = adds.column("path").to_pylist()
    sizes = adds.column("size_bytes").to_pylist()
    values = adds.column("partition.job_id").to_pylist()
    return {n: s for n, s, v in zip(names, sizes, values, strict=True) if v == job_id}


def _read_rows(storage: DurableStorage, name: str, job_id: str) -> list[dict[str, Any]]:
    """The rows of one data file, with the partition value the log gives it (a file may hold
    the partition column too, as delta-spark's do: the log's value is the one that counts)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _file_schema()
    data = pq.read_table(pa.BufferReader(storage.get_bytes(unquote(name))))
    columns = [
        data.column(f.name).cast(f.type)
        if f.name in data.column_names
        else pa.nulls(data.num_rows, f.type)
        for f in schema
    ]
    rows = pa.Table.from_arrays(columns, schema=schema).to_pylist()
    return [{"job_id": job_id, **row} for row in rows]


def _file_schema():
    """The columns a data file holds: the table's, less the partition column."""
    schema = arrow_schema(TABLE)
    return schema.remove(schema.get_field_index("job_id"))


def _write_file(storage: DurableStorage, rows: list[dict[str, Any]]) -> tuple[str, int, int, int]:
    """A new data file at the table's root (the log gives its partition value) holding ``rows``
    sorted by path; returns its name, size, modification time (ms) and row count. Not part of
    the table until committed; an uncommitted one is VACUUM's to remove."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _file_schema()
    rows = sorted(rows, key=lambda r: r["path"])
    data = pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema)
    name = f"part-00000-cutline-gc-{uuid.uuid4()}.c000.snappy.parquet"
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, compression="snappy")
    storage.put_bytes(name, sink.getvalue().to_pybytes())
    info = storage.stat(name)
    return name, info.size, int(info.modified * 1000), len(rows)
