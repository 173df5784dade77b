"""``cutline state read``: one state of one stage of a job's checkpoint, as a table (no Spark:
restored and decoded by state/state_reader.py, printed or written as a Delta table with
delta-rs). :func:`load_state` is what ``cutline.read_state`` turns into a Spark DataFrame."""

from __future__ import annotations

import argparse
import tempfile

import pyarrow as pa

from cutline.job import JobDefinition, KeyedProcess, key_columns
from spark_jobs.catalog.tables import CatalogReader
from spark_jobs.deploy.settings import RuntimePaths
from state.catalog import CheckpointStatus
from state.paths import JobLayout
from state.restore import read_manifest
from state.state_reader import StateReadError, read_state
from state.state_types import KeyCodec
from state.storage import open_storage


def stage_of(job: JobDefinition, stage: str) -> KeyedProcess:
    """The stage with uid (or name) ``stage``; :class:`StateReadError` naming the job's."""
    for s in job.stages:
        if stage in (s.uid, s.name):
            return s
    known = ", ".join(f"{s.name!r} (uid {s.uid!r})" for s in job.stages)
    raise StateReadError(f"job {job.name!r} has no stage {stage!r} (its stages: {known})")


def load_state(
    job: JobDefinition,
    stage: str,
    state: str,
    paths: RuntimePaths,
    checkpoint_id: int | None = None,
) -> pa.Table:
    """State ``state`` of ``stage`` (uid or name) in checkpoint ``checkpoint_id`` of ``job``
    (default: its latest completed one), decoded with the job's definition."""
    s = stage_of(job, stage)
    specs = {spec.name: spec for spec in s.function.states}
    if state not in specs:
        raise StateReadError(
            f"stage {s.name!r} (uid {s.uid!r}) has no state {state!r} (its states: {sorted(specs)})"
        )
    if checkpoint_id is None:
        done = CatalogReader(paths.catalog).checkpoints(job.name, (CheckpointStatus.COMPLETED,))
        if not done:
            raise StateReadError(f"job {job.name!r} has no completed checkpoint in the catalog")
        checkpoint_id = done[-1].checkpoint_id
    storage = open_storage(paths.checkpoint_root)
    layout = JobLayout(job.name)
    manifest = read_manifest(storage, layout.job_path(layout.metadata(checkpoint_id)))
    names = key_columns(s.key_column)
    codec = KeyCodec(s.key_type, job.max_parallelism, names if len(names) > 1 else ())
    with tempfile.TemporaryDirectory(prefix="cutline-state-read-") as scratch:
        return read_state(manifest, storage, s.uid, specs[state], codec, names, scratch)


def print_state(table: pa.Table, limit: int) -> None:
    """The first ``limit`` rows, then how many there are."""
    columns = table.column_names
    print("\t".join(columns))
    for row in table.slice(0, limit).to_pylist():
        print("\t".join(str(row[c]) for c in columns))
    print(f"({table.num_rows:,} rows)")


def state_read(args: argparse.Namespace, job: JobDefinition, paths: RuntimePaths) -> int:
    from state.storage.tables import write_table

    table = load_state(job, args.stage, args.state, paths, args.checkpoint)
    if args.out:
        write_table(args.out, table, mode="overwrite")
        print(f"{table.num_rows:,} rows written to the Delta table {args.out}")
    else:
        print_state(table, args.limit)
    return 0
