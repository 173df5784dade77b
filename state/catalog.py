"""The catalog interface: where a checkpoint becomes complete (docs/design.md §2).

A checkpoint is complete exactly when :meth:`CheckpointCatalog.commit_checkpoint` returns. The
runtime implements this interface on Delta tables; ``state/`` only depends on the protocol.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
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


def shared_file_rows(manifest: CheckpointManifest, known: set[str]) -> list[dict[str, Any]]:
    """The ``shared_state_files`` rows of the shared files ``manifest`` references that are
    not ``known`` (registered already): those its checkpoint brought."""
    return [
        {
            "job_id": manifest.job_id,
            "path": f.path,
            "operator": h.operator,
            "subtask": h.subtask,
            "size": f.stored_size,
            "created_by": manifest.checkpoint_id,
            "last_used": manifest.checkpoint_id,
            "refcount": 1,
            "status": "LIVE",
        }
        for h in manifest.subtasks
        for f in h.files
        if f.shared and f.path not in known
    ]


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

    def newest_checkpoint_id(self, job_id: str) -> int:
        """The highest checkpoint id of the job in any status (0 if none)."""
        return max((c.checkpoint_id for c in self.checkpoints(job_id)), default=0)


class JobCatalog(CheckpointCatalog):
    """What the runtime needs of the catalog besides checkpoints: attempts' lifecycle, restore
    records and the shared-file registry. The driver, GC and the orchestration depend on this
    protocol; the Delta implementation is ``spark_jobs/catalog/delta_catalog.py``."""

    conflicts_retried: int = 0  # commits planned again after a concurrent commit got in first

    @abstractmethod
    def jobs(self, job_id: str) -> list[dict[str, Any]]:
        """The job's attempts (rows of ``streaming_jobs``), ascending by attempt."""

    @abstractmethod
    def newest_attempt(self, job_id: str) -> int:
        """The highest attempt number of ``job_id`` that has begun (0 if none)."""

    @abstractmethod
    def set_job_status(self, job_id: str, attempt: int, status: str, reason: str = "") -> None:
        """End the attempt with ``status`` and a one-line ``reason``."""

    @abstractmethod
    def set_restored(
        self, job_id: str, attempt: int, restored_from: int | None, allocation: dict[str, str]
    ) -> None:
        """Record what the attempt restored and which host holds each subtask's state."""

    @abstractmethod
    def heartbeat(self, job_id: str, attempt: int) -> None:
        """The attempt's driver is alive."""

    @abstractmethod
    def record_recovery(self, row: dict[str, Any]) -> None:
        """Append one restore's record (``recoveries``)."""

    @abstractmethod
    def record_shared_files(self, rows: list[dict[str, Any]]) -> None:
        """Append the shared files a completed checkpoint registered (``shared_state_files``);
        never lost to a concurrent :meth:`update_shared_files`."""

    @abstractmethod
    def record_savepoint(self, row: dict[str, Any]) -> None:
        """Append a savepoint taken, or a savepoint request that failed (``savepoints``)."""

    @abstractmethod
    def savepoints(self, job_id: str) -> list[dict[str, Any]]:
        """The job's rows of ``savepoints``, oldest first."""

    @abstractmethod
    def set_savepoint_status(self, job_id: str, location: str, status: str) -> None:
        """Change the status of the job's savepoint at ``location`` (e.g. DELETED)."""

    @abstractmethod
    def shared_files(self, job_id: str) -> list[dict[str, Any]]:
        """The job's rows of the shared-file registry."""

    @abstractmethod
    def update_shared_files(self, job_id: str, plan: Callable[[list[dict[str, Any]]], Any]) -> Any:
        """Change the job's registry rows as ``plan(rows)`` says, in one commit that the running
        job's appends cannot fail (re-planned on a conflicting commit)."""
