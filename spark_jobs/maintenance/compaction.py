"""``cutline compact JOB``: ask a job to compact its state when its latest checkpoint's chain of
files has grown past the job's limits (the Dagster compaction job runs the same).

Reads the catalog with delta-rs and one manifest: no Spark. The running attempt (or the next
one, if none runs) serves the request at its next barrier (see :mod:`state.compaction`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from spark_jobs.catalog.tables import CatalogReader, now_ms
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.job_loader import get_job
from state.catalog import CheckpointStatus
from state.compaction import (
    CompactionRequest,
    read_request,
    source_checkpoints,
    subtasks_to_compact,
    write_request,
)
from state.paths import JobLayout
from state.restore import read_manifest
from state.storage import open_storage


@dataclass
class CompactionDecision:
    job: str
    latest_checkpoint: int | None
    files: dict[int, int] = field(default_factory=dict)  # subtask -> files referenced
    source_checkpoints: dict[int, int] = field(default_factory=dict)  # subtask -> uploaders
    requested: list[int] = field(default_factory=list)  # subtasks asked to compact
    reason: str = ""
    already_pending: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def request_compaction(
    job_ref: str,
    paths: RuntimePaths,
    *,
    force: bool = False,
    max_files: int | None = None,
    max_checkpoints: int | None = None,
    dry_run: bool = False,
) -> CompactionDecision:
    """Measure the latest completed checkpoint of the job ``job_ref`` (a name or ``module:attr``)
    and, where a subtask exceeds the limits (the job's ``compaction_max_*`` unless given; every
    subtask with ``force``), store a compaction request. An unserved earlier request is
    replaced."""
    job = get_job(job_ref)
    job_name, cfg = job.name, job.checkpoint
    max_files = cfg.compaction_max_files if max_files is None else max_files
    max_checkpoints = cfg.compaction_max_checkpoints if max_checkpoints is None else max_checkpoints
    rows = CatalogReader(paths.catalog).checkpoints(job_name, (CheckpointStatus.COMPLETED,))
    decision = CompactionDecision(job_name, rows[-1].checkpoint_id if rows else None)
    storage = open_storage(paths.checkpoint_root)
    layout = JobLayout(job_name)
    decision.already_pending = read_request(storage, layout) is not None
    if not rows:
        decision.reason = "no completed checkpoint"
        return decision
    manifest = read_manifest(storage, rows[-1].metadata_path)
    for h in manifest.subtasks:
        decision.files[h.subtask] = len(h.files)
        decision.source_checkpoints[h.subtask] = source_checkpoints(h)
    if force:
        over = {h.subtask: "forced" for h in manifest.subtasks}
    else:
        over = subtasks_to_compact(manifest, max_files=max_files, max_checkpoints=max_checkpoints)
    decision.requested = sorted(over)
    decision.reason = "; ".join(f"subtask {s}: {why}" for s, why in sorted(over.items()))
    if over and not dry_run:
        request = CompactionRequest(
            tuple(decision.requested), now_ms(), manifest.checkpoint_id, decision.reason
        )
        write_request(storage, layout, request)
    return decision
