"""What one attempt's micro-batches have reached: :class:`Progress` (the epoch, the sources'
positions, the stages' watermarks and the counters, folded from every micro-batch's
:class:`~spark_jobs.executor.reports.SubtaskStats`). The attempt's report is
spark_jobs/driver/run_state.py's ``RunSummary``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cutline.job import JobDefinition
from spark_jobs.driver.evolution import checkpoint_parallelism
from spark_jobs.executor.reports import SubtaskStats
from state.manifest import CheckpointManifest, PartitionClock, PartitionClocks, Positions
from state.rescale import rescaled_clocks


@dataclass
class Progress:
    """Where the attempt's micro-batches stand. Written by the micro-batches alone, one thread
    at a time: the restore's replay (before the query's first micro-batch may run), then Spark's
    stream thread and an idle barrier's thread (each holding the micro-batch lock), then the
    final checkpoint on the main thread (after the query stopped); cuts carry copies. Not
    locked: the one read without the micro-batch lock is the watch's idle check of ``epoch``
    (driver/micro_batches.py ``when_idle``), a hint whose decision the idle barrier takes again
    under the lock; an int attribute is read whole, so a stale value there starts at most a
    barrier thread that finds nothing to do."""

    job: JobDefinition
    epoch: int = 0
    positions: Positions = field(default_factory=dict)
    watermarks: dict[str, int] = field(default_factory=dict)  # per stage uid
    counters: dict[str, int] = field(default_factory=dict)
    clocks: PartitionClocks = field(default_factory=dict)  # per stage uid, input, partition

    def adopt(self, manifest: CheckpointManifest | None) -> None:
        """Take a restored checkpoint's watermarks, per-partition clocks (of the stages the job
        still has) and counters. Folding the epochs after it then gives what an uninterrupted
        run gave. Restored at another parallelism, a later stage's partitions that are upstream
        subtasks are renumbered (state/rescale.py ``rescaled_clocks``)."""
        held = manifest.watermarks if manifest else {}
        self.watermarks = {s.uid: held[s.uid] for s in self.job.stages if s.uid in held}
        clocks = manifest.partition_clocks if manifest else {}
        self.clocks = {
            s.uid: {src: dict(parts) for src, parts in clocks[s.uid].items()}
            for s in self.job.stages
            if s.uid in clocks
        }
        was = checkpoint_parallelism(self.job, manifest) if manifest else None
        if was is not None and was != self.job.parallelism:  # rescaled: subtasks renumbered
            sources = {s.name for s in self.job.sources}
            for inputs in self.clocks.values():
                for name, parts in inputs.items():
                    if name not in sources:  # an upstream stage's subtasks
                        inputs[name] = rescaled_clocks(
                            parts, was, self.job.parallelism, self.job.max_parallelism
                        )
        self.counters = dict(manifest.counters) if manifest else {}

    def fold(self, stats: Sequence[SubtaskStats], processing_time: int) -> None:
        """One micro-batch's subtask statistics into the positions, the stages' watermarks and
        the counters. ``processing_time``: the one the micro-batch was planned with (a replay
        passes the epoch's original one), the idleness clock. A stage's watermark is the
        minimum, over its input partitions that had records within its ``idle_timeout_ms``, of
        their largest event time less its lag; it never goes back, and holds while every
        partition is idle."""
        for r in stats:
            for source, parts in r.positions.items():
                current = self.positions.setdefault(source, {})
                for part, end in parts.items():
                    current[part] = max(current.get(part, 0), end)
        for stage in self.job.stages:
            lag = stage.watermark_lag_ms()
            if lag is None:
                continue
            clocks = self.clocks.setdefault(stage.uid, {})
            for r in stats:
                if r.stage != stage.uid:
                    continue
                for source, parts in r.event_times.items():
                    inputs = clocks.setdefault(source, {})
                    for part, high in parts.items():
                        old = inputs.get(part)
                        top = high if old is None else max(old.max_event_time, high)
                        inputs[part] = PartitionClock(top, processing_time)
            idle = stage.idle_timeout_ms
            active = [
                c.max_event_time
                for parts in clocks.values()
                for c in parts.values()
                if idle is None or processing_time - c.last_records_ms < idle
            ]
            if active:
                candidate = min(active) - lag
                self.watermarks[stage.uid] = max(
                    self.watermarks.get(stage.uid, candidate), candidate
                )
        for counter, n in (
            ("bad_records", sum(r.bad_records for r in stats)),
            ("late_records", sum(r.late_records for r in stats)),
        ):
            if n:
                self.counters[counter] = self.counters.get(counter, 0) + n

    def position_copy(self) -> Positions:
        return {k: dict(v) for k, v in self.positions.items()}

    def clocks_copy(self) -> PartitionClocks:
        """The per-partition clocks, for a cut (the clocks themselves are immutable)."""
        return {uid: {s: dict(p) for s, p in inputs.items()} for uid, inputs in self.clocks.items()}
