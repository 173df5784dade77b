"""A checkpoint between its trigger and its completion, and what the coordinator answers and
announces about it (state/coordinator.py runs the protocol)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from state.catalog import CompletedCheckpoint
from state.handles import SubtaskStateHandle
from state.manifest import CheckpointManifest, PartitionClocks

TaskId = tuple[str, int]  # (stage uid, subtask index)


class AckResult(enum.Enum):
    """What the coordinator did with an ack (or a cut)."""

    ACCEPTED = "accepted"  # recorded; the checkpoint may still wait for others
    COMPLETED = "completed"  # this ack completed the checkpoint
    DUPLICATE = "duplicate"  # this task already acked this checkpoint
    LATE = "late"  # the checkpoint was already completed or aborted
    UNKNOWN = "unknown"  # no such checkpoint, or not a task of this job


class CheckpointListener(Protocol):
    """Told of each completion, abort and job failure, outside the coordinator's lock, in the
    order they happened."""

    def on_checkpoint_complete(
        self, checkpoint: CompletedCheckpoint, manifest: CheckpointManifest
    ) -> None: ...

    def on_checkpoint_aborted(self, checkpoint_id: int, reason: str) -> None: ...

    def on_job_failed(self, error: BaseException) -> None: ...


@dataclass
class PendingCheckpoint:
    """Checkpoint n from its trigger until every task acked and its cut is recorded."""

    checkpoint_id: int
    batch_id: int
    trigger_time_ms: int
    source_positions: dict[str, dict[str, int]]
    sink_epochs: dict[str, int]
    waiting: set[TaskId]
    watermarks: dict[str, int] = field(default_factory=dict)
    acks: dict[TaskId, SubtaskStateHandle | None] = field(default_factory=dict)
    savepoint: bool = False
    cut_recorded: bool = True
    epoch_ends: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    epoch_times: dict[int, int] = field(default_factory=dict)
    partition_clocks: PartitionClocks = field(default_factory=dict)

    def to_manifest(
        self, job_id: str, attempt: int, stages: dict[str, dict[str, str]]
    ) -> CheckpointManifest:
        """The self-contained manifest of this checkpoint, every ack and its cut being in."""
        return CheckpointManifest(
            job_id=job_id,
            checkpoint_id=self.checkpoint_id,
            batch_id=self.batch_id,
            attempt=attempt,
            trigger_time_ms=self.trigger_time_ms,
            source_positions=self.source_positions,
            sink_epochs=self.sink_epochs,
            watermarks=self.watermarks,
            subtasks=tuple(
                sorted((h for h in self.acks.values() if h is not None), key=lambda h: h.task)
            ),
            savepoint=self.savepoint,
            epoch_ends=self.epoch_ends,
            counters=self.counters,
            stages=stages,
            epoch_times=self.epoch_times,
            partition_clocks=self.partition_clocks,
        )
