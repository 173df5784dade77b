"""The durable storage interface: :class:`DurableStorage`, the file it lists
(:class:`ObjectInfo`) and its errors. Implementations: state/storage/local.py and
state/storage/s3.py."""

from __future__ import annotations

import contextlib
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


class StorageError(Exception):
    """A storage operation failed; the message names the path and the storage url."""

    def __init__(self, message: str, *, path: str | None = None, url: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.url = url


class MissingFileError(StorageError):
    """The file does not exist in storage."""


class CorruptFileError(StorageError):
    """The stored file's size differs from the expected size."""

    def __init__(self, message: str, *, path: str, url: str, expected: int, actual: int) -> None:
        super().__init__(message, path=path, url=url)
        self.expected = expected
        self.actual = actual


class AlreadyExistsError(StorageError):
    """An exclusive write found the path already taken (another writer got there first)."""


class AccessError(StorageError):
    """The storage refuses this process outright: the bucket or directory does not exist or
    cannot be written, access is denied, the credentials are missing or wrong. Not transient:
    retrying the same configuration cannot help."""


@dataclass(frozen=True)
class ObjectInfo:
    """One stored file: its path relative to the storage root, size in bytes, mtime (epoch s)."""

    path: str
    size: int
    modified: float


class DurableStorage(ABC):
    """A flat namespace of files addressed by relative '/'-separated paths."""

    url: str

    @abstractmethod
    def put_file(self, local_path: str | Path, path: str) -> int:
        """Store the local file at ``path`` atomically; return the number of bytes written."""

    @abstractmethod
    def put_bytes(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        """Store ``data`` at ``path`` atomically.

        With ``exclusive``, the write happens only if ``path`` does not exist yet (atomically
        with respect to other writers), else :class:`AlreadyExistsError` is raised, unless
        ``path`` already holds exactly ``data``: that is this writer's own earlier try (a
        retried request whose first try took effect before its answer was lost), so an
        exclusive writer must write content no other writer would (its attempt, its id).
        """

    @abstractmethod
    def get_file(self, path: str, local_path: str | Path, expected_size: int | None = None) -> int:
        """Copy ``path`` to ``local_path`` atomically and return its size.

        Raises MissingFileError if absent and CorruptFileError if its size is not
        ``expected_size``; in both cases ``local_path`` is left untouched.
        """

    @abstractmethod
    def get_bytes(self, path: str, expected_size: int | None = None) -> bytes:
        """Return the content of ``path`` (MissingFileError, CorruptFileError as for get_file)."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a file exists at ``path``."""

    @abstractmethod
    def stat(self, path: str) -> ObjectInfo:
        """Size and modification time of ``path``; MissingFileError if absent."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """All files under the directory ``prefix`` ("" = the whole root), recursively, by path.

        ``prefix`` is a directory: ``list("a")`` yields ``a/x`` and ``a/b/y`` but not ``ab/z``.
        """

    @abstractmethod
    def probe(self) -> None:
        """Raise :class:`AccessError` if this process cannot use the storage at all (see
        there); a transient failure raises :class:`StorageError`. Cheap: one request."""

    def copy_to(
        self, path: str, target: DurableStorage, target_path: str, expected_size: int | None = None
    ) -> int:
        """Copy ``path`` to ``target_path`` in ``target`` (atomically there) and return its size.

        Through a local temporary file; implementations copy inside the storage service where
        they can. Raises MissingFileError or CorruptFileError (``expected_size``) as
        :meth:`get_file` does, with ``target`` left untouched.
        """
        import tempfile

        with tempfile.TemporaryDirectory(prefix="cutline-copy-") as scratch:
            local = Path(scratch) / "file"
            size = self.get_file(path, local, expected_size)
            target.put_file(local, target_path)
        return size

    @abstractmethod
    def delete(self, path: str) -> bool:
        """Delete ``path``; True if it existed, False if it was already missing."""

    @abstractmethod
    def delete_many(self, paths: Iterable[str]) -> int:
        """Delete all ``paths`` (all are checked before any is deleted); return how many."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _holds(self, path: str, data: bytes) -> bool:
        """Whether ``path`` exists and holds exactly ``data`` (an exclusive write's own)."""
        try:
            return self.get_bytes(path) == bytes(data)
        except MissingFileError:
            return False

    # Helpers for messages that always name the path and the url.
    def _missing(self, path: str, detail: str = "") -> MissingFileError:
        suffix = f" ({detail})" if detail else ""
        return MissingFileError(
            f"{path!r} does not exist in {self.url}{suffix}", path=path, url=self.url
        )

    def _failed(self, action: str, path: str, detail: str) -> StorageError:
        return StorageError(
            f"cannot {action} {path!r} in {self.url}: {detail}", path=path, url=self.url
        )

    def _check_size(self, path: str, expected: int | None, actual: int) -> None:
        if expected is not None and expected != actual:
            raise CorruptFileError(
                f"{path!r} in {self.url} has {actual} bytes, expected {expected}",
                path=path,
                url=self.url,
                expected=expected,
                actual=actual,
            )


TMP_PREFIX = ".tmp-"  # the temp files of atomic writes (listed like any file; GC removes them)


def tmp_name() -> str:
    return f"{TMP_PREFIX}{uuid.uuid4().hex}"


def remove_quietly(path: str | Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
