"""A job's state outside the job (Flink's State Processor API): read one state of one stage of
a checkpoint into a Spark DataFrame. The same as ``cutline state read``."""

from __future__ import annotations

from typing import Any

from cutline.job import JobDefinition


def read_state(
    spark: Any,
    job: JobDefinition | str,
    stage: str,
    state: str,
    checkpoint: int | None = None,
    *,
    home: str | None = None,
) -> Any:
    """State ``state`` of ``stage`` (uid or name) in checkpoint ``checkpoint`` of ``job`` (a
    definition, a registered name or ``module:attr``; default: its latest completed checkpoint),
    as a Spark DataFrame: the key's columns, ``key_group``, and ``value`` (value state),
    ``list_index`` and ``list_element`` (list state, a row per element) or ``user_map_key`` and
    ``user_map_value`` (map state, a row per entry), and ``expires_at_ms`` with a TTL. Paths
    come from the deployment's settings (``home``: everything under that directory). Raises
    ``ValueError`` naming what is missing or stored in another form."""
    from spark_jobs.commands.state_read import load_state
    from spark_jobs.deploy.settings import load_settings
    from spark_jobs.job_loader import get_job

    settings = load_settings()
    paths = (settings.at_home(home) if home else settings).paths()
    definition = get_job(job) if isinstance(job, str) else job
    return spark.createDataFrame(load_state(definition, stage, state, paths, checkpoint))
