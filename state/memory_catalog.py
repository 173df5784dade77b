"""A process-local catalog: the :class:`CheckpointCatalog` protocol held in memory.

For single-process use (the local demo, unit tests). It fences attempts exactly like the Delta
catalog of the runtime, but forgets everything when the process exits.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable

from state.catalog import CheckpointCatalog, CheckpointStatus, CompletedCheckpoint, FencedError


class InMemoryCatalog(CheckpointCatalog):
    """Thread-safe; ``fail_next_commit`` lets tests inject one commit failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: dict[tuple[str, int], CompletedCheckpoint] = {}
        self.attempts: dict[str, int] = {}
        self.fail_next_commit: Exception | None = None

    def begin_attempt(self, job_id: str, run_id: str = "", **details) -> int:
        with self._lock:
            self.attempts[job_id] = self.attempts.get(job_id, 0) + 1
            return self.attempts[job_id]

    def commit_checkpoint(self, checkpoint: CompletedCheckpoint) -> None:
        with self._lock:
            if self.fail_next_commit is not None:
                error, self.fail_next_commit = self.fail_next_commit, None
                raise error
            latest = self.attempts.get(checkpoint.job_id, 0)
            if checkpoint.attempt < latest:
                raise FencedError(
                    f"attempt {checkpoint.attempt} of {checkpoint.job_id} is fenced by {latest}"
                )
            self.rows[(checkpoint.job_id, checkpoint.checkpoint_id)] = checkpoint

    def _set_status(self, job_id: str, ids: Iterable[int], status: CheckpointStatus) -> None:
        with self._lock:
            for cid in ids:
                row = self.rows.get((job_id, cid))
                if row is not None:
                    self.rows[(job_id, cid)] = dataclasses.replace(row, status=status)

    def mark_subsumed(self, job_id: str, checkpoint_ids: list[int]) -> None:
        self._set_status(job_id, checkpoint_ids, CheckpointStatus.SUBSUMED)

    def mark_corrupt(self, job_id: str, checkpoint_id: int, reason: str) -> None:
        self._set_status(job_id, [checkpoint_id], CheckpointStatus.CORRUPT)

    def checkpoints(
        self, job_id: str, statuses: tuple[CheckpointStatus, ...] | None = None
    ) -> list[CompletedCheckpoint]:
        with self._lock:
            rows = [r for (j, _), r in self.rows.items() if j == job_id]
        return sorted(
            (r for r in rows if statuses is None or r.status in statuses),
            key=lambda r: r.checkpoint_id,
        )
