"""An attempt's restore step, on its own thread beside the streaming query's start: every
subtask's working state restored local-first on the host its hint names, falling back past
checkpoints with positive evidence against them (spark_jobs/driver/restore_fallback.py); the
micro-batch tasks anchored to where each subtask now lives (placement.py); the epochs the sinks
committed after the restored checkpoint replayed without output; the recovery recorded in the
catalog; after a rescale, the subtasks asked to compact at the next barrier."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cutline.sinks import SinkWriter
from spark_jobs.catalog.tables import now_ms
from spark_jobs.driver.epoch_ends import EpochEnds
from spark_jobs.driver.evolution import checkpoint_parallelism
from spark_jobs.driver.micro_batches import MicroBatches
from spark_jobs.driver.placement import anchor_rdd, executor_hosts, preferred_hosts
from spark_jobs.driver.progress import Progress
from spark_jobs.driver.restore_fallback import (
    Restored,
    recovery_row,
    replay_epochs,
    restore_with_fallback,
)
from spark_jobs.driver.run_state import RunState
from spark_jobs.driver.startup_phases import StartupTimeline
from state.catalog import JobCatalog
from state.compaction import CompactionRequest, write_request
from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.storage import DurableStorage


@dataclass
class AttemptRestore:
    """Restores one attempt's working state; ``wanted`` is the ``--restore`` choice, ``hints``
    the executor hints (subtask -> host)."""

    spark: object
    catalog: JobCatalog
    storage: DurableStorage
    sinks: Sequence[SinkWriter]
    ends: EpochEnds
    batches: MicroBatches
    progress: Progress
    state: RunState
    wanted: str | int | None
    hints: dict[str, str]
    executor_wait_s: float
    exactly_once: bool
    log: Callable[[str], None]
    timeline: StartupTimeline

    def __call__(
        self, manifest: CheckpointManifest | None, fallbacks: list[str]
    ) -> tuple[Restored, dict[str, str]]:
        """Restore from ``manifest`` (or older, on evidence), then replay up to the progress's
        epoch. Returns what was restored and the allocation (subtask -> host)."""
        ctx, started = self.batches.ctx, time.perf_counter()
        job, attempt, target = ctx.job, ctx.attempt, self.progress.epoch

        def epoch_of(m: CheckpointManifest | None) -> int:
            return m.batch_id if m is not None and self.exactly_once else target

        restored = restore_with_fallback(
            self.spark,
            ctx,
            self.catalog,
            self.storage,
            manifest,
            epoch_of,
            wanted=self.wanted,
            hints=self.hints,
            executor_wait_s=self.executor_wait_s,
            log=self.log,
        )
        restored.fallbacks[:0] = fallbacks
        if restored.manifest is not manifest:
            self.progress.adopt(restored.manifest)
        m = restored.manifest
        self.state.restored(m.checkpoint_id if m else None, restored.reports)
        allocation = {str(r.subtask): r.host for r in restored.reports}
        sc = self.spark.sparkContext
        # every micro-batch task of subtask i runs where subtask i was restored (placement.py)
        self.batches.anchor = anchor_rdd(
            sc, preferred_hosts(allocation, job.parallelism, executor_hosts(sc))
        )
        if m is not None and epoch_of(m) < target:
            ends = self.ends.committed_through(m, target, self.sinks)
            times = self.ends.replay_times(m)
            self.batches.replay(replay_epochs(m, target, ends, times))
        self.catalog.set_restored(job.name, attempt, m.checkpoint_id if m else None, allocation)
        if m is not None:
            row = recovery_row(
                job.name, attempt, restored, self.hints, time.perf_counter() - started
            )
            self.catalog.record_recovery(row)
            self.log(
                f"restored checkpoint {m.checkpoint_id} (batch {m.batch_id}): "
                f"{row['subtasks_local']} subtasks local, {row['subtasks_remote']} remote, "
                f"{row['files_local'] + row['files_remote']} files: "
                f"{row['bytes_local']:,} B local, {row['bytes_remote']:,} B remote"
            )
            was = checkpoint_parallelism(job, m)
            if was is not None and was != job.parallelism:
                joined = [r.joined for r in restored.reports if r.joined]
                by_files = joined.count("files")
                why = next((j for j in joined if j != "files"), None)
                self.log(
                    f"rescaled: checkpoint {m.checkpoint_id} was taken at parallelism {was}, "
                    f"restored at {job.parallelism} (key groups of {job.max_parallelism} "
                    "redistributed; each subtask built from the old ones overlapping it; "
                    f"{by_files} joined several by files, {len(joined) - by_files} by copying "
                    "keys" + (f", the first {why}" if why else "") + ")"
                )
                # the key groups each subtask dropped are compacted away at the next barrier,
                # off the restore's path (state/rescale.py)
                reason = f"rescaled from parallelism {was} to {job.parallelism}"
                request = CompactionRequest((), now_ms(), m.checkpoint_id, reason)
                write_request(self.storage, JobLayout(job.name), request)
        self.timeline.note_overlapped("restore", time.perf_counter() - started)
        return restored, allocation
