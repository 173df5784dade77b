"""Durable storage on a local (or mounted) filesystem: atomic writes by temp file, fsync and
rename; exclusive creates by hard link."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from state.paths import check_relative
from state.storage.base import (
    AccessError,
    AlreadyExistsError,
    DurableStorage,
    ObjectInfo,
    remove_quietly,
    tmp_name,
)

_CHUNK = 1 << 20


def _copy_stream(src: IO[bytes], dst: IO[bytes]) -> int:
    """Copy ``src`` to ``dst`` in chunks; return the number of bytes copied."""
    total = 0
    while True:
        chunk = src.read(_CHUNK)
        if not chunk:
            return total
        dst.write(chunk)
        total += len(chunk)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort; not all platforms allow it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_local_write(
    target: Path,
    write: Callable[[IO[bytes]], int],
    *,
    fsync: bool,
    check: Callable[[int], None] | None = None,
    exclusive: bool = False,
) -> int:
    """Write ``target`` via a '.tmp-' file in its directory and ``os.replace``.

    With ``exclusive`` the temp file is hard-linked to ``target`` instead, which fails with
    ``FileExistsError`` if ``target`` exists.

    ``write`` fills the temp file and returns the byte count; ``check`` may reject it, in which
    case the target is not touched. The temp file is removed on any failure.
    """
    tmp = target.parent / tmp_name()
    # A concurrent delete may remove a just-created empty parent dir; recreate it a few times.
    for attempt in range(3):
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    try:
        with os.fdopen(fd, "wb") as out:
            size = write(out)
            out.flush()
            if fsync:
                os.fsync(out.fileno())
        if check is not None:
            check(size)
        if exclusive:
            os.link(tmp, target)
            remove_quietly(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        remove_quietly(tmp)
        raise
    if fsync:
        _fsync_dir(target.parent)
    return size


class LocalFileStorage(DurableStorage):
    """Files under a local directory (created on first write).

    Writes go to a '.tmp-' file in the target directory, are flushed and fsynced and then
    renamed over the target, so readers see the old or the new file, never a partial one.
    ``list`` reports every file, including '.tmp-' files of writes in progress or of crashed
    writers. ``delete`` removes parent directories that became empty, up to the root.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(os.path.abspath(os.fspath(root)))
        self.url = self.root.as_uri()

    def _target(self, path: str) -> Path:
        return self.root / check_relative(path)

    def probe(self) -> None:
        """The root exists (or is created) and this process may write it."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AccessError(f"cannot create {self.url}: {exc}", path=".", url=self.url) from exc
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise AccessError(f"cannot write {self.url}: permission denied", path=".", url=self.url)

    def put_file(self, local_path: str | Path, path: str) -> int:
        target = self._target(path)
        try:
            src = open(local_path, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise self._failed("store", path, f"cannot read source {local_path}: {exc}") from exc
        try:
            with src:
                return _atomic_local_write(target, lambda out: _copy_stream(src, out), fsync=True)
        except OSError as exc:
            raise self._failed("store", path, f"from {local_path}: {exc}") from exc

    def copy_to(
        self, path: str, target: DurableStorage, target_path: str, expected_size: int | None = None
    ) -> int:
        """Straight from the file (no temporary copy)."""
        size = self.stat(path).size
        self._check_size(path, expected_size, size)
        target.put_file(self._target(path), target_path)
        return size

    def put_bytes(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        target = self._target(path)
        payload = bytes(data)

        def write(out: IO[bytes]) -> int:
            out.write(payload)
            return len(payload)

        try:
            _atomic_local_write(target, write, fsync=True, exclusive=exclusive)
        except FileExistsError as exc:
            if self._holds(path, payload):
                return
            raise AlreadyExistsError(
                f"{path!r} already exists in {self.url}", path=path, url=self.url
            ) from exc
        except OSError as exc:
            raise self._failed("store", path, str(exc)) from exc

    def _open_for_read(self, path: str) -> IO[bytes]:
        target = self._target(path)
        try:
            if target.is_dir():
                raise self._missing(path, "it is a directory")
            return open(target, "rb")
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise self._missing(path) from exc
        except OSError as exc:
            raise self._failed("read", path, str(exc)) from exc

    def get_file(self, path: str, local_path: str | Path, expected_size: int | None = None) -> int:
        src = self._open_for_read(path)
        dest = Path(os.path.abspath(os.fspath(local_path)))
        try:
            with src:
                return _atomic_local_write(
                    dest,
                    lambda out: _copy_stream(src, out),
                    fsync=False,
                    check=lambda size: self._check_size(path, expected_size, size),
                )
        except OSError as exc:
            raise self._failed("fetch", path, f"to {local_path}: {exc}") from exc

    def get_bytes(self, path: str, expected_size: int | None = None) -> bytes:
        src = self._open_for_read(path)
        try:
            with src:
                data = src.read()
        except OSError as exc:
            raise self._failed("read", path, str(exc)) from exc
        self._check_size(path, expected_size, len(data))
        return data

    def exists(self, path: str) -> bool:
        return self._target(path).is_file()

    def stat(self, path: str) -> ObjectInfo:
        target = self._target(path)
        try:
            st = target.stat()
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise self._missing(path) from exc
        except OSError as exc:
            raise self._failed("stat", path, str(exc)) from exc
        if not target.is_file():
            raise self._missing(path, "not a regular file")
        return ObjectInfo(path=path, size=st.st_size, modified=st.st_mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        start = self._target(prefix) if prefix else self.root
        found: list[ObjectInfo] = []
        pending = [(start, prefix)]
        while pending:
            directory, rel = pending.pop()
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        child = f"{rel}/{entry.name}" if rel else entry.name
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                pending.append((Path(entry.path), child))
                            elif entry.is_file():
                                st = entry.stat()
                                found.append(ObjectInfo(child, st.st_size, st.st_mtime))
                        except (FileNotFoundError, NotADirectoryError):
                            continue  # deleted while we were listing
            except (FileNotFoundError, NotADirectoryError):
                continue  # missing prefix, or a directory deleted while we were listing
            except OSError as exc:
                raise self._failed("list", rel or prefix or ".", str(exc)) from exc
        found.sort(key=lambda info: info.path)
        return iter(found)

    def _unlink(self, path: str) -> bool:
        target = self._target(path)
        try:
            if target.is_dir():
                raise self._failed("delete", path, "it is a directory")
            target.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise self._failed("delete", path, str(exc)) from exc
        return True

    def _prune_empty(self, directory: Path) -> None:
        """Remove ``directory`` and its parents up to the root while they are empty."""
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                break  # not empty (or gone, or not ours): stop, best effort
            directory = directory.parent

    def delete(self, path: str) -> bool:
        deleted = self._unlink(path)
        if deleted:
            self._prune_empty(self._target(path).parent)
        return deleted

    def delete_many(self, paths: Iterable[str]) -> int:
        checked = list(dict.fromkeys(check_relative(p) for p in paths))
        deleted = [p for p in checked if self._unlink(p)]
        emptied = {self._target(p).parent for p in deleted}  # pruned once each, deepest first
        for directory in sorted(emptied, key=lambda d: len(d.parts), reverse=True):
            self._prune_empty(directory)
        return len(deleted)
