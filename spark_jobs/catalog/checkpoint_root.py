"""The checkpoint root a job's checkpoints were written under, checked before anything reads
or deletes under a root: a restore (spark_jobs/driver/attempt_start.py) and GC
(spark_jobs/maintenance/gc.py) given another root are refused by name, never led to take the
job's checkpoints for missing."""

from __future__ import annotations

from pathlib import Path

from spark_jobs.errors import ConfigurationError
from state.catalog import CheckpointStatus, JobCatalog
from state.storage import DurableStorage


def same_root(a: str, b: str) -> bool:
    """Whether two roots name one place: URLs by their text, local paths resolved."""
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return Path(a).resolve() == Path(b).resolve()


def check_root(
    catalog: JobCatalog, storage: DurableStorage, job_id: str, checkpoint_root: str
) -> None:
    """Refuse a checkpoint root that is not where the job's completed checkpoints are: the root
    their attempt recorded differs, or the root holds none of their manifests."""
    rows = catalog.checkpoints(job_id, (CheckpointStatus.COMPLETED,))
    if not rows:
        return
    roots = {r["attempt"]: r.get("checkpoint_root") for r in catalog.jobs(job_id)}
    latest = max(rows, key=lambda r: r.checkpoint_id)
    recorded = roots.get(latest.attempt)
    if recorded and not same_root(recorded, checkpoint_root):
        raise ConfigurationError(
            f"checkpoint {latest.checkpoint_id} of {job_id} was written under the checkpoint "
            f"root {recorded}, but this run's checkpoint root is {checkpoint_root}: run with "
            "the deployment's settings (docs/design.md §7)"
        )
    if not any(storage.exists(r.metadata_path) for r in rows):
        raise ConfigurationError(
            f"the checkpoint root {checkpoint_root} holds none of the manifests of {job_id}'s "
            f"completed checkpoints {[r.checkpoint_id for r in rows]}: is it the right root?"
        )
