"""What one attempt has reached: :class:`Progress` (the epoch, the sources' positions, the
stages' watermarks and the counters, folded from every micro-batch's subtask statistics) and
:class:`RunSummary` (the attempt's report to whoever started it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spark_jobs.job import JobDefinition
from state.manifest import CheckpointManifest, Positions


@dataclass
class RunSummary:
    job: str
    attempt: int
    restored_from: int | None
    batches: int = 0
    records: int = 0
    checkpoints: list[int] = field(default_factory=list)  # completed, in order
    aborted: list[int] = field(default_factory=list)
    restore_reports: list[dict[str, Any]] = field(default_factory=list)
    positions: dict[str, dict[str, int]] = field(default_factory=dict)
    late_records: int = 0
    bad_records: int = 0
    replayed_epochs: int = 0  # committed epochs replayed without output after the restore
    failure: str | None = None
    batch_ms: list[float] = field(default_factory=list)  # wall time of each micro-batch
    batch_checkpointing: list[bool] = field(default_factory=list)  # a checkpoint was in flight


@dataclass
class Progress:
    """Where the attempt's micro-batches stand. Written by the micro-batches alone: the restore's
    replay (before the query's first micro-batch may run), then Spark's stream thread; cuts
    carry copies."""

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

    def fold(self, stats: list[dict]) -> None:
        """One micro-batch's subtask statistics into the positions, the stages' watermarks (the
        largest event time less the stage's lag, never going back) and the counters."""
        for r in stats:
            for source, parts in r["positions"].items():
                current = self.positions.setdefault(source, {})
                for part, end in parts.items():
                    current[part] = max(current.get(part, 0), end)
        for stage in self.job.stages:
            lag = stage.watermark_lag_ms()
            times = [
                r["max_event_time"]
                for r in stats
                if r["stage"] == stage.uid and r["max_event_time"] is not None
            ]
            if lag is not None and times:
                candidate = max(times) - lag
                self.watermarks[stage.uid] = max(
                    self.watermarks.get(stage.uid, candidate), candidate
                )
        for counter in ("bad_records", "late_records"):
            n = sum(r[counter] for r in stats)
            if n:
                self.counters[counter] = self.counters.get(counter, 0) + n

    def position_copy(self) -> Positions:
        return {k: dict(v) for k, v in self.positions.items()}
