"""A start that does not continue the job's history: an explicit start-over
(``--restore none``), or a savepoint of another job or written from tables
(driver/savepoints.py). Its output must not be appended to what the sinks already hold, and no
later restore may go back to the job's older checkpoints."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cutline.sinks import SinkWriter
from spark_jobs.errors import ConfigurationError
from state.catalog import CheckpointStatus, JobCatalog


def begin_new_history(
    catalog: JobCatalog,
    job_id: str,
    sinks: Sequence[SinkWriter],
    reset: bool,
    log: Callable[[str], None],
    *,
    label: str,
    refusal: Callable[[str], str],
) -> None:
    """Refuse when a sink has output, unless ``reset``, which deletes it (``refusal(table)``:
    the error's message); retire the job's completed checkpoints (SUBSUMED: GC collects them,
    no restore goes back to them). ``label`` starts the log lines."""
    with_output = [s for s in sinks if s.has_output()]
    if with_output and not reset:
        raise ConfigurationError(refusal(with_output[0].table_path))
    for sink in with_output:
        log(f"sink {sink.sink}: {label} deletes {sink.reset():,} rows of {sink.table_path}")
    old = [c.checkpoint_id for c in catalog.checkpoints(job_id, (CheckpointStatus.COMPLETED,))]
    if old:
        catalog.mark_subsumed(job_id, old)
        log(f"{label}: checkpoints {old} retired")
