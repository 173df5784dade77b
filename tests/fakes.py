"""Test doubles for unit tests of state/: an in-memory catalog and fault-injecting storage.

The tests that claim a guarantee end to end use the real parts (Delta catalog, moto S3 server);
these doubles let the protocol tests drive every interleaving quickly.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from state.catalog import CheckpointCatalog, CheckpointStatus, CompletedCheckpoint, FencedError
from state.storage import DurableStorage, ObjectInfo


class InMemoryCatalog(CheckpointCatalog):
    """A thread-safe catalog held in a dict, with attempt fencing like the Delta one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: dict[tuple[str, int], CompletedCheckpoint] = {}
        self.attempts: dict[str, int] = {}
        self.fail_next_commit: Exception | None = None

    def begin_attempt(self, job_id: str) -> int:
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


class FaultyStorage(DurableStorage):
    """Wraps real storage; ``fail_put`` decides per path whether a write raises ``OSError``."""

    def __init__(self, inner: DurableStorage) -> None:
        self.inner = inner
        self.url = inner.url
        self.fail_put: Callable[[str], bool] = lambda path: False
        self.puts: list[str] = []

    def _maybe_fail(self, path: str) -> None:
        if self.fail_put(path):
            raise OSError(f"injected storage fault writing {path}")
        self.puts.append(path)

    def put_file(self, local_path: str | Path, path: str) -> int:
        self._maybe_fail(path)
        return self.inner.put_file(local_path, path)

    def put_bytes(self, path: str, data: bytes) -> None:
        self._maybe_fail(path)
        self.inner.put_bytes(path, data)

    def get_file(self, path: str, local_path: str | Path, expected_size: int | None = None) -> int:
        return self.inner.get_file(path, local_path, expected_size)

    def get_bytes(self, path: str, expected_size: int | None = None) -> bytes:
        return self.inner.get_bytes(path, expected_size)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def stat(self, path: str) -> ObjectInfo:
        return self.inner.stat(path)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, path: str) -> bool:
        return self.inner.delete(path)

    def delete_many(self, paths: Iterable[str]) -> int:
        return self.inner.delete_many(paths)
