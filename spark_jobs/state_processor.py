"""A job's state outside the job (Flink's State Processor API): read one state of one stage of
a checkpoint into a Spark DataFrame (the same as ``cutline state read``), and write a savepoint
from DataFrames, new or as a changed copy of a checkpoint, for a job to start from. A tool over
a deployment's checkpoints, so it lives with the runtime's services (its catalog, settings and
job loader): ``from spark_jobs.state_processor import read_state, write_savepoint``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cutline.job import JobDefinition
from spark_jobs.commands.state_read import load_state, load_timers
from spark_jobs.commands.state_write import write_savepoint_from_tables
from spark_jobs.deploy.settings import load_settings
from spark_jobs.job_loader import get_job


def read_state(
    spark: Any,
    job: JobDefinition | str,
    stage: str,
    state: str,
    checkpoint: int | str | None = None,
    *,
    home: str | None = None,
) -> Any:
    """State ``state`` of ``stage`` (uid or name) in ``checkpoint`` of ``job`` (a definition, a
    registered name or ``module:attr``): a checkpoint id (default: its latest completed one) or
    a savepoint's location, wherever it was moved to,
    as a Spark DataFrame: the key's columns, ``key_group``, and ``value`` (value state),
    ``list_index`` and ``list_element`` (list state, a row per element) or ``user_map_key`` and
    ``user_map_value`` (map state, a row per entry), and ``expires_at_ms`` with a TTL. Paths
    come from the deployment's settings (``home``: everything under that directory). Raises
    ``ValueError`` naming what is missing or stored in another form."""
    definition, paths = _job_and_paths(job, home)
    return spark.createDataFrame(load_state(definition, stage, state, paths, checkpoint))


def read_timers(
    spark: Any,
    job: JobDefinition | str,
    stage: str,
    checkpoint: int | str | None = None,
    *,
    home: str | None = None,
) -> Any:
    """The timers ``stage`` (uid or name) had registered in ``checkpoint`` of ``job`` (as
    :func:`read_state` takes them), as a Spark DataFrame: the key's columns, ``key_group``,
    ``timestamp`` (epoch ms) and ``domain`` ("event" or "processing")."""
    definition, paths = _job_and_paths(job, home)
    return spark.createDataFrame(load_timers(definition, stage, paths, checkpoint))


def write_savepoint(
    job: JobDefinition | str,
    states: Mapping[tuple[str, str], Any],
    target: str,
    *,
    base: str | int | None = None,
    positions: Mapping[str, Mapping[str, int]] | None = None,
    home: str | None = None,
    timers: Mapping[str, Any] | None = None,
) -> str:
    """Write a savepoint of ``job`` at ``target`` (a directory: path or URL) whose states are
    ``states``: ``(stage uid or name, state name)`` -> a Spark DataFrame, a pandas DataFrame or
    an Arrow table with the columns :func:`read_state` returns (``key_group`` may be left
    out; a TTL state needs ``expires_at_ms``). Each is the state's whole content.

    ``base``: ``"latest"`` or a checkpoint id of the job, or a savepoint's location: the
    savepoint is the base with those states replaced, and a job restored from it continues the
    base's history (fix a value, drop keys). None: a new savepoint (migrate state from another
    system): a job restored from it reads its sources from ``positions`` (source -> partition
    -> position; default their beginning) and starts another history. Start a job from it with
    ``cutline run JOB --restore TARGET``. ``timers``: per stage (uid or name), the timers it
    has registered, as :func:`read_timers` returns them (a bootstrapped job's timers fire as
    its own would). Returns the savepoint's location. Raises ``ValueError`` naming a stage,
    state or column that does not fit the job."""
    definition, paths = _job_and_paths(job, home)
    tables = {key: _arrow(frame) for key, frame in states.items()}
    timer_tables = {stage: _arrow(frame) for stage, frame in (timers or {}).items()}
    info = write_savepoint_from_tables(
        definition, tables, target, paths, base=base, positions=positions, timers=timer_tables
    )
    return info.location


def _job_and_paths(job: JobDefinition | str, home: str | None) -> tuple[JobDefinition, Any]:
    """The job's definition and the deployment's paths (``home``: everything under it)."""
    settings = load_settings()
    paths = (settings.at_home(home) if home else settings).paths()
    return (get_job(job) if isinstance(job, str) else job), paths


def _arrow(frame: Any):
    """An Arrow table of a Spark DataFrame, a pandas DataFrame or an Arrow table."""
    import pyarrow as pa

    if isinstance(frame, pa.Table):
        return frame
    if hasattr(frame, "toArrow"):  # Spark
        return frame.toArrow()
    return pa.Table.from_pandas(frame, preserve_index=False)
