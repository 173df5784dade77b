"""Savepoints written from tables, with a job's definition: the writing half of the state
processor API (``spark_jobs.state_processor.write_savepoint``). No Spark: the tables are Arrow
tables (the Python function turns DataFrames into them).

Each table is one state of one stage, in the form ``cutline state read`` gives it
(state/state_writer.py); its columns, keys and values are checked against the job's
declaration of that state. Without a base the savepoint is new (a migration from another
system: the job that restores it starts another history, at the sources' ``positions``); with a
base (a checkpoint of the job, or a savepoint) it is the base with those states replaced (fix a
value, drop keys: the job that restores it continues the base's history).
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from cutline.job import JobDefinition
from cutline.keyed_process import TIMER_SETS
from spark_jobs.commands.state_read import checkpoint_source, stage_codec, stage_of, state_of
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.driver.evolution import check_restorable
from state.manifest import CheckpointManifest, Positions
from state.paths import JobLayout, SavepointLayout
from state.savepoint import SavepointInfo
from state.savepoint_writer import write_states_savepoint
from state.state_timers import EncodedTimers, encode_timers
from state.state_writer import EncodedState, StateWriteError, encode_state
from state.storage import DurableStorage, open_storage


def write_savepoint_from_tables(
    job: JobDefinition,
    tables: Mapping[tuple[str, str], pa.Table],
    target: str,
    paths: RuntimePaths,
    *,
    base: str | int | None = None,
    positions: Positions | None = None,
    timers: Mapping[str, pa.Table] | None = None,
) -> SavepointInfo:
    """A savepoint of ``job`` at ``target`` whose states ``(stage uid or name, state name)``
    are ``tables``. ``base``: ``latest`` or a checkpoint id of the job, or a savepoint's
    location, whose other state and history it keeps; none: a new savepoint, the sources read
    from ``positions`` (default: their beginning). ``timers``: per stage (uid or name), the
    timers it has registered (the columns ``cutline state read --timers`` gives), which replace
    the base's."""
    writes: dict[str, list[EncodedState | EncodedTimers]] = {}
    for (stage, state), table in tables.items():
        s = stage_of(job, stage)
        spec = state_of(s, state)
        where = f"stage {s.name!r} (uid {s.uid!r}), state {state!r}"
        if any(e.spec.name == state for e in writes.get(s.uid, [])):
            raise StateWriteError(f"{where}: given twice")
        codec, names = stage_codec(job, s)
        writes.setdefault(s.uid, []).append(encode_state(table, spec, codec, names, where))
    for stage, table in (timers or {}).items():
        s = stage_of(job, stage)
        codec, names = stage_codec(job, s)
        where = f"stage {s.name!r} (uid {s.uid!r}), timers"
        if any(isinstance(e, EncodedTimers) for e in writes.get(s.uid, [])):
            raise StateWriteError(f"{where}: given twice")
        writes.setdefault(s.uid, []).append(encode_timers(table, TIMER_SETS, codec, names, where))
    based = None if base is None else _base(job, paths, base)
    if based is not None:
        check_restorable(job, based[0])
        if positions is not None:
            raise StateWriteError("positions come from the base: give them only without one")
    return write_states_savepoint(
        writes,
        open_storage(target),
        job_id=job.name,
        stages={s.uid: s.state_schema() for s in job.stages},
        parallelism=job.parallelism,
        max_parallelism=job.max_parallelism,
        base=based,
        positions=positions,
    )


def _base(
    job: JobDefinition, paths: RuntimePaths, base: str | int
) -> tuple[CheckpointManifest, DurableStorage, JobLayout | SavepointLayout]:
    """The manifest, storage and layout of ``base``: a savepoint's location (checksums
    verified), or ``latest`` or a checkpoint id of the job."""
    wanted = None if base == "latest" else base
    storage, manifest, layout = checkpoint_source(job, paths, wanted, checksums=True)
    return manifest, storage, layout
