"""``cutline state read``: one state of one stage of a job's checkpoint, as a table (no Spark:
restored and decoded by state/state_reader.py, printed or written as a Delta table with
delta-rs). :func:`load_state` is what ``spark_jobs.state_processor.read_state`` turns into a
Spark DataFrame; :func:`restore_drill` restores a whole checkpoint in a sandbox and reads all its
state (the Dagster restore drill)."""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from cutline.job import JobDefinition, KeyedProcess, key_columns
from cutline.keyed_process import TIMER_SETS
from spark_jobs.catalog.tables import CatalogReader
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.driver.savepoints import is_location
from state.catalog import CheckpointStatus
from state.manifest import CheckpointManifest
from state.paths import JobLayout, SavepointLayout
from state.restore import read_manifest
from state.savepoint import read_savepoint
from state.state_reader import StateReadError, read_state, read_states
from state.state_timers import read_timers
from state.state_types import KeyCodec, StateSpec
from state.storage import DurableStorage, open_storage


def stage_of(job: JobDefinition, stage: str) -> KeyedProcess:
    """The stage with uid (or name) ``stage``; :class:`StateReadError` naming the job's."""
    for s in job.stages:
        if stage in (s.uid, s.name):
            return s
    known = ", ".join(f"{s.name!r} (uid {s.uid!r})" for s in job.stages)
    raise StateReadError(f"job {job.name!r} has no stage {stage!r} (its stages: {known})")


def latest_manifest(
    job: JobDefinition,
    paths: RuntimePaths,
    storage: DurableStorage,
    checkpoint_id: int | None = None,
) -> CheckpointManifest:
    """The manifest of checkpoint ``checkpoint_id`` of ``job`` in ``storage`` (default: its
    latest completed one in the catalog)."""
    if checkpoint_id is None:
        done = CatalogReader(paths.catalog).checkpoints(job.name, (CheckpointStatus.COMPLETED,))
        if not done:
            raise StateReadError(f"job {job.name!r} has no completed checkpoint in the catalog")
        checkpoint_id = done[-1].checkpoint_id
    layout = JobLayout(job.name)
    return read_manifest(storage, layout.job_path(layout.metadata(checkpoint_id)))


def state_of(s: KeyedProcess, state: str) -> StateSpec:
    """State ``state`` of stage ``s``; :class:`StateReadError` naming the stage's states."""
    specs = {spec.name: spec for spec in s.function.states}
    if state not in specs:
        raise StateReadError(
            f"stage {s.name!r} (uid {s.uid!r}) has no state {state!r} (its states: {sorted(specs)})"
        )
    return specs[state]


def stage_codec(job: JobDefinition, s: KeyedProcess) -> tuple[KeyCodec, tuple[str, ...]]:
    """Stage ``s``'s key codec and key column names."""
    names = key_columns(s.key_column)
    return KeyCodec(s.key_type, job.max_parallelism, names if len(names) > 1 else ()), names


def load_state(
    job: JobDefinition,
    stage: str,
    state: str,
    paths: RuntimePaths,
    checkpoint: int | str | None = None,
) -> pa.Table:
    """State ``state`` of ``stage`` (uid or name) in ``checkpoint`` of ``job``: a checkpoint
    id (default: its latest completed one) or a savepoint's location (a path or URL, wherever
    it was moved to, restored or not), decoded with the job's definition."""
    s = stage_of(job, stage)
    spec = state_of(s, state)
    codec, names = stage_codec(job, s)
    storage, manifest, layout = checkpoint_source(job, paths, checkpoint)
    with tempfile.TemporaryDirectory(prefix="cutline-state-read-") as scratch:
        return read_state(manifest, storage, s.uid, spec, codec, names, Path(scratch), layout)


def load_timers(
    job: JobDefinition, stage: str, paths: RuntimePaths, checkpoint: int | str | None = None
) -> pa.Table:
    """The timers ``stage`` (uid or name) had registered in ``checkpoint`` of ``job`` (as
    :func:`load_state` takes it): the key's columns, ``key_group``, ``timestamp`` and
    ``domain`` ("event" or "processing")."""
    s = stage_of(job, stage)
    codec, names = stage_codec(job, s)
    storage, manifest, layout = checkpoint_source(job, paths, checkpoint)
    with tempfile.TemporaryDirectory(prefix="cutline-timers-read-") as scratch:
        return read_timers(
            manifest, storage, s.uid, TIMER_SETS, codec, names, Path(scratch), layout
        )


def checkpoint_source(
    job: JobDefinition,
    paths: RuntimePaths,
    checkpoint: int | str | None,
    *,
    checksums: bool = False,
) -> tuple[DurableStorage, CheckpointManifest, JobLayout | SavepointLayout]:
    """The storage, manifest and layout of ``checkpoint``: a savepoint's location (every file
    checked, sizes and with ``checksums`` their bytes, before any is read), or a checkpoint id
    of the job (default: its latest completed one)."""
    if isinstance(checkpoint, str) and is_location(checkpoint):
        storage = open_storage(checkpoint)
        return storage, read_savepoint(storage, checksums=checksums), SavepointLayout()
    storage = open_storage(paths.checkpoint_root)
    wanted = None if checkpoint is None else int(checkpoint)
    return storage, latest_manifest(job, paths, storage, wanted), JobLayout(job.name)


@dataclass(frozen=True)
class DrillReport:
    """A restore drill of one checkpoint: how long it took, the bytes read, and the rows of
    every state read (``stage uid/state`` -> rows)."""

    job: str
    checkpoint_id: int
    seconds: float
    bytes_read: int
    rows: dict[str, int] = field(default_factory=dict)


def restore_drill(
    job: JobDefinition,
    paths: RuntimePaths,
    storage: DurableStorage | None = None,
    checkpoint_id: int | None = None,
) -> DrillReport:
    """Restore checkpoint ``checkpoint_id`` of ``job`` (default: the latest completed) in a
    sandbox, a temporary directory (no sink commits, no catalog writes: nothing a running
    attempt uses), and read every state of every stage it holds with the job's definition:
    every file is read and checked against its size and checksum, every state decoded. Raises
    what it found (a missing or damaged file, a state in another form). ``storage``: the
    checkpoint root's (default: opened from ``paths``)."""
    started = time.perf_counter()
    storage = storage or open_storage(paths.checkpoint_root)
    manifest = latest_manifest(job, paths, storage, checkpoint_id)
    held = {h.operator for h in manifest.subtasks}
    rows: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="cutline-drill-") as scratch:
        for s in job.stages:
            if s.uid not in held:
                continue  # a stage the checkpoint predates: it would start empty
            codec, names = stage_codec(job, s)
            specs = list(s.function.states)
            tables = read_states(manifest, storage, s.uid, specs, codec, names, Path(scratch))
            rows.update({f"{s.uid}/{name}": t.num_rows for name, t in tables.items()})
    return DrillReport(
        job.name,
        manifest.checkpoint_id,
        round(time.perf_counter() - started, 3),
        sum(f.stored_size for f in manifest.files()),
        rows,
    )


def print_state(table: pa.Table, limit: int) -> None:
    """The first ``limit`` rows, then how many there are."""
    columns = table.column_names
    print("\t".join(columns))
    for row in table.slice(0, limit).to_pylist():
        print("\t".join(str(row[c]) for c in columns))
    print(f"({table.num_rows:,} rows)")


def state_read(args: argparse.Namespace, job: JobDefinition, paths: RuntimePaths) -> int:
    from state.storage.tables import write_table

    if (args.state is None) == (not args.timers):
        raise StateReadError("give the state to read (--state NAME) or --timers")
    if args.timers:
        table = load_timers(job, args.stage, paths, args.checkpoint)
    else:
        table = load_state(job, args.stage, args.state, paths, args.checkpoint)
    if args.out:
        write_table(args.out, table, mode="overwrite")
        print(f"{table.num_rows:,} rows written to the Delta table {args.out}")
    else:
        print_state(table, args.limit)
    return 0
