"""Test doubles for unit tests of state/: fault-injecting storage.

The tests that claim a guarantee end to end use the real parts (moto S3 server, real RocksDB);
this wrapper lets protocol tests inject storage faults at exact points.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from state.memory_catalog import InMemoryCatalog  # noqa: F401  (re-exported for tests)
from state.storage import DurableStorage, ObjectInfo


class FaultyStorage(DurableStorage):
    """Wraps real storage; ``fail_put``, ``fail_get`` and ``fail_list`` decide per path (or
    prefix) whether a write, a read of bytes or a listing raises ``OSError``."""

    def __init__(self, inner: DurableStorage) -> None:
        self.inner = inner
        self.url = inner.url
        self.fail_put: Callable[[str], bool] = lambda path: False
        self.fail_get: Callable[[str], bool] = lambda path: False
        self.fail_list: Callable[[str], bool] = lambda prefix: False
        self.puts: list[str] = []

    def _maybe_fail(self, path: str) -> None:
        if self.fail_put(path):
            raise OSError(f"injected storage fault writing {path}")
        self.puts.append(path)

    def put_file(self, local_path: str | Path, path: str) -> int:
        self._maybe_fail(path)
        return self.inner.put_file(local_path, path)

    def put_bytes(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        self._maybe_fail(path)
        self.inner.put_bytes(path, data, exclusive=exclusive)

    def get_file(self, path: str, local_path: str | Path, expected_size: int | None = None) -> int:
        return self.inner.get_file(path, local_path, expected_size)

    def get_bytes(self, path: str, expected_size: int | None = None) -> bytes:
        if self.fail_get(path):
            raise OSError(f"injected storage fault reading {path}")
        return self.inner.get_bytes(path, expected_size)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def stat(self, path: str) -> ObjectInfo:
        return self.inner.stat(path)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        if self.fail_list(prefix):
            raise OSError(f"injected storage fault listing {prefix}")
        return self.inner.list(prefix)

    def probe(self) -> None:
        self.inner.probe()

    def delete(self, path: str) -> bool:
        return self.inner.delete(path)

    def delete_many(self, paths: Iterable[str]) -> int:
        return self.inner.delete_many(paths)
