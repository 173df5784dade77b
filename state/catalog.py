"""The catalog interface: where a checkpoint becomes complete (docs/design.md §2).

A checkpoint is complete exactly when :meth:`CheckpointCatalog.commit_checkpoint` returns. The
runtime implements this interface on Delta tables; ``state/`` only depends on the protocol.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from state.manifest import CheckpointManifest
from state.paths import JobLayout


class CheckpointStatus(str, enum.Enum):
    COMPLETED = "COMPLETED"
    SUBSUMED = "SUBSUMED"
    CORRUPT = "CORRUPT"


class FencedError(RuntimeError):
    """An older attempt tried to complete a checkpoint after a newer attempt started."""


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A catalog row of ``completed_checkpoints``."""

    job_id: str
    checkpoint_id: int
    batch_id: int
    attempt: int
    trigger_time_ms: int
    complete_time_ms: int
    metadata_path: str
    full_size: int
    incremental_size: int
    file_count: int
    sync_ms: float
    async_ms: float
    source_positions: dict[str, dict[str, int]] = field(default_factory=dict)
    status: CheckpointStatus = CheckpointStatus.COMPLETED
    savepoint: bool = False

    @classmethod
    def from_manifest(cls, m: CheckpointManifest, complete_time_ms: int) -> CompletedCheckpoint:
        handles = m.subtasks
        return cls(
            job_id=m.job_id,
            checkpoint_id=m.checkpoint_id,
            batch_id=m.batch_id,
            attempt=m.attempt,
            trigger_time_ms=m.trigger_time_ms,
            complete_time_ms=complete_time_ms,
            metadata_path=JobLayout(m.job_id).job_path(
                JobLayout(m.job_id).metadata(m.checkpoint_id)
            ),
            full_size=m.full_size,
            incremental_size=m.uploaded_bytes,
            file_count=m.file_count,
            sync_ms=max((h.sync_ms for h in handles), default=0.0),
            async_ms=max((h.async_ms for h in handles), default=0.0),
            source_positions=m.source_positions,
            savepoint=m.savepoint,
        )

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["status"] = self.status.value
        return d


class CheckpointCatalog(ABC):
    """What the coordinator needs from the catalog. Implementations must be thread-safe."""

    @abstractmethod
    def begin_attempt(self, job_id: str, run_id: str = "", **details: Any) -> int:
        """Start a new attempt of ``job_id`` and return its number, which no other starter gets;
        from then on no older attempt can commit a checkpoint (:class:`FencedError`)."""

    @abstractmethod
    def commit_checkpoint(self, checkpoint: CompletedCheckpoint) -> None:
        """Atomically record ``checkpoint`` as COMPLETED.

        Raises :class:`FencedError` if a newer attempt of the job has started.
        """

    @abstractmethod
    def mark_subsumed(self, job_id: str, checkpoint_ids: list[int]) -> None: ...

    @abstractmethod
    def mark_corrupt(self, job_id: str, checkpoint_id: int, reason: str) -> None: ...

    @abstractmethod
    def checkpoints(
        self, job_id: str, statuses: tuple[CheckpointStatus, ...] | None = None
    ) -> list[CompletedCheckpoint]:
        """Rows of the job, ascending by checkpoint id, optionally filtered by status."""
