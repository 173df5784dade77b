"""What one attempt's micro-batches have reached: :class:`Progress` (the epoch, the sources'
positions, the stages' watermarks and the counters, folded from every micro-batch's
:class:`~spark_jobs.runtime.reports.SubtaskStats`). The attempt's report is
spark_jobs/runtime/run_state.py's ``RunSummary``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from spark_jobs.job import JobDefinition
from spark_jobs.runtime.reports import SubtaskStats
from state.manifest import CheckpointManifest, Positions


@dataclass
class Progress:
    """Where the attempt's micro-batches stand. Written by the micro-batches alone, one thread
    at a time: the restore's replay (before the query's first micro-batch may run), then Spark's
    stream thread, then the final checkpoint on the main thread (after the query stopped); cuts
    carry copies. Not shared, so not locked (runtime/run_state.py)."""

    job: JobDefinition
    epoch: int = 0
    positions: Positions = field(default_factory=dict)
    watermarks: dict[str, int] = field(default_factory=dict)  # per stage uid
    counters: dict[str, int] = field(default_factory=dict)

    def adopt(self, manifest: CheckpointManifest | None) -> None:
        """Take a restored checkpoint's watermarks (of the stages the job still has) and
        counters."""
        held = manifest.watermarks if manifest else {}
        self.watermarks = {s.uid: held[s.uid] for s in self.job.stages if s.uid in held}
        self.counters = dict(manifest.counters) if manifest else {}

    def fold(self, stats: Sequence[SubtaskStats]) -> None:
        """One micro-batch's subtask statistics into the positions, the stages' watermarks (the
        largest event time less the stage's lag, never going back) and the counters."""
        for r in stats:
            for source, parts in r.positions.items():
                current = self.positions.setdefault(source, {})
                for part, end in parts.items():
                    current[part] = max(current.get(part, 0), end)
        for stage in self.job.stages:
            lag = stage.watermark_lag_ms()
            times = [
                r.max_event_time
                for r in stats
                if r.stage == stage.uid and r.max_event_time is not None
            ]
            if lag is not None and times:
                candidate = max(times) - lag
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
