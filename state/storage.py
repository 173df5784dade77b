"""Durable storage for checkpoint files: one small interface, a local and an S3 implementation.

Every path argument is a '/'-separated path relative to the storage root and passes
:func:`state.paths.check_relative` before anything touches storage, so a bad manifest entry can
never read, write or delete outside the root.

Guarantees common to both implementations:

* writes are atomic for readers: a path holds either its previous content or the complete new
  content, never a partial file;
* ``get_file`` writes the local copy atomically (temp file + rename) and only after the size
  check passed, so a failed or short download never leaves a file at ``local_path``;
* every :class:`StorageError` message names the path and the storage url.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlsplit

from state.paths import check_relative

__all__ = [
    "CorruptFileError",
    "DurableStorage",
    "LocalFileStorage",
    "MissingFileError",
    "ObjectInfo",
    "S3Storage",
    "StorageError",
    "open_storage",
]

_TMP_PREFIX = ".tmp-"
_CHUNK = 1 << 20


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
        with respect to other writers), else :class:`AlreadyExistsError` is raised.
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
    def delete(self, path: str) -> bool:
        """Delete ``path``; True if it existed, False if it was already missing."""

    @abstractmethod
    def delete_many(self, paths: Iterable[str]) -> int:
        """Delete all ``paths`` (all are checked before any is deleted); return how many."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

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


def _copy_stream(src: IO[bytes], dst: IO[bytes]) -> int:
    """Copy ``src`` to ``dst`` in chunks; return the number of bytes copied."""
    total = 0
    while True:
        chunk = src.read(_CHUNK)
        if not chunk:
            return total
        dst.write(chunk)
        total += len(chunk)


_S3_TAKEN_CODES = ("PreconditionFailed", "ConditionalRequestConflict")


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _tmp_name() -> str:
    return f"{_TMP_PREFIX}{uuid.uuid4().hex}"


def _remove_quietly(path: str | Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


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
    tmp = target.parent / _tmp_name()
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
            _remove_quietly(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        _remove_quietly(tmp)
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

    def put_bytes(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        target = self._target(path)
        payload = bytes(data)

        def write(out: IO[bytes]) -> int:
            out.write(payload)
            return len(payload)

        try:
            _atomic_local_write(target, write, fsync=True, exclusive=exclusive)
        except FileExistsError as exc:
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


_S3_MIN_PART = 5 * 2**20
_S3_DELETE_BATCH = 1000
_S3_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class S3Storage(DurableStorage):
    """Objects in an S3 bucket under an optional key prefix.

    Credentials come only from boto3's standard chain. Retries are botocore's "standard" mode
    with at most ``max_attempts`` attempts per request, the first one included. Uploads use
    boto3's managed transfer (multipart above ``multipart_threshold``); S3 makes a PUT or a
    completed multipart upload visible atomically. ``delete`` and ``delete_many`` are
    idempotent; because S3 does not say whether a key existed, ``delete`` checks with a HEAD
    first and ``delete_many`` counts every key S3 acknowledged, including already missing ones.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        max_attempts: int = 8,
        client: Any = None,
        multipart_threshold: int = 64 * 2**20,
    ) -> None:
        if not isinstance(bucket, str) or not _BUCKET_RE.match(bucket):
            raise ValueError(f"invalid S3 bucket name {bucket!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        prefix = prefix.strip("/")
        if prefix:
            check_relative(prefix, what="S3 prefix")
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._key_prefix = f"{prefix}/" if prefix else ""

        from boto3.s3.transfer import TransferConfig

        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=max(_S3_MIN_PART, min(multipart_threshold, 16 * 2**20)),
        )
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                # total_max_attempts counts the first try; botocore's "max_attempts" would not.
                retries={"mode": "standard", "total_max_attempts": max_attempts},
                connect_timeout=10,
                read_timeout=60,
            )
            client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url, region_name=region_name, config=config
            )
        self._client = client

    def _key(self, path: str) -> str:
        return self._key_prefix + check_relative(path)

    def _error(self, exc: Exception, action: str, path: str) -> StorageError:
        from botocore.exceptions import ClientError

        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code in _S3_MISSING_CODES:
                return self._missing(path)
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            message = error.get("Message") or ""
            return self._failed(action, path, f"{code} (HTTP {status}) {message}".strip())
        return self._failed(action, path, f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _errors() -> tuple[type[Exception], ...]:
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        return (ClientError, BotoCoreError, Boto3Error, OSError)

    def put_file(self, local_path: str | Path, path: str) -> int:
        key = self._key(path)
        try:
            size = os.stat(local_path).st_size
        except OSError as exc:
            raise self._failed("store", path, f"cannot read source {local_path}: {exc}") from exc
        try:
            self._client.upload_file(os.fspath(local_path), self.bucket, key, Config=self._transfer)
        except self._errors() as exc:
            raise self._error(exc, "store", path) from exc
        return size

    def put_bytes(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        key = self._key(path)
        extra = {"IfNoneMatch": "*"} if exclusive else {}
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=bytes(data), **extra)
        except self._errors() as exc:
            if exclusive and _error_code(exc) in (
                "PreconditionFailed",
                "ConditionalRequestConflict",
            ):
                raise AlreadyExistsError(
                    f"{path!r} already exists in {self.url}", path=path, url=self.url
                ) from exc
            raise self._error(exc, "store", path) from exc

    def get_file(self, path: str, local_path: str | Path, expected_size: int | None = None) -> int:
        key = self._key(path)
        dest = Path(os.path.abspath(os.fspath(local_path)))
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._failed("fetch", path, f"to {local_path}: {exc}") from exc
        tmp = dest.parent / _tmp_name()
        try:
            self._client.download_file(self.bucket, key, os.fspath(tmp), Config=self._transfer)
            size = tmp.stat().st_size
            self._check_size(path, expected_size, size)
            os.replace(tmp, dest)
        except self._errors() as exc:
            raise self._error(exc, "fetch", path) from exc
        finally:
            _remove_quietly(tmp)
        return size

    def get_bytes(self, path: str, expected_size: int | None = None) -> bytes:
        key = self._key(path)
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=key)
            with contextlib.closing(response["Body"]) as body:
                data = body.read()
        except self._errors() as exc:
            raise self._error(exc, "read", path) from exc
        self._check_size(path, expected_size, len(data))
        return data

    def _head(self, path: str) -> dict[str, Any]:
        key = self._key(path)
        try:
            return self._client.head_object(Bucket=self.bucket, Key=key)
        except self._errors() as exc:
            raise self._error(exc, "stat", path) from exc

    def exists(self, path: str) -> bool:
        try:
            self._head(path)
        except MissingFileError:
            return False
        return True

    def stat(self, path: str) -> ObjectInfo:
        head = self._head(path)
        return ObjectInfo(
            path=path, size=int(head["ContentLength"]), modified=head["LastModified"].timestamp()
        )

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        key_prefix = self._key(prefix) + "/" if prefix else self._key_prefix
        return self._list(prefix, key_prefix)

    def _list(self, prefix: str, key_prefix: str) -> Iterator[ObjectInfo]:
        strip = len(self._key_prefix)
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=key_prefix
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    yield ObjectInfo(
                        path=obj["Key"][strip:],
                        size=int(obj["Size"]),
                        modified=obj["LastModified"].timestamp(),
                    )
        except self._errors() as exc:
            raise self._error(exc, "list", prefix or ".") from exc

    def delete(self, path: str) -> bool:
        key = self._key(path)
        if not self.exists(path):
            return False
        try:
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except self._errors() as exc:
            raise self._error(exc, "delete", path) from exc
        return True

    def delete_many(self, paths: Iterable[str]) -> int:
        keys = [self._key(p) for p in dict.fromkeys(paths)]
        strip = len(self._key_prefix)
        deleted = 0
        failures: list[str] = []
        for start in range(0, len(keys), _S3_DELETE_BATCH):
            batch = keys[start : start + _S3_DELETE_BATCH]
            try:
                response = self._client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
            except self._errors() as exc:
                raise self._error(exc, "delete", batch[0][strip:]) from exc
            errors = response.get("Errors", [])
            deleted += len(batch) - len(errors)
            failures.extend(f"{e.get('Key', '?')[strip:]!r}: {e.get('Code', '?')}" for e in errors)
        if failures:
            first = failures[0].split(":", 1)[0].strip("'")
            shown = ", ".join(failures[:5]) + (" ..." if len(failures) > 5 else "")
            raise StorageError(
                f"cannot delete {len(failures)} of {len(keys)} paths in {self.url}: {shown}",
                path=first,
                url=self.url,
            )
        return deleted


_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def open_storage(url: str, *, endpoint_url: str | None = None) -> DurableStorage:
    """Open storage from a url: ``file:///abs``, a local path, or ``s3://bucket[/prefix]``.

    ``endpoint_url`` applies to S3 only; None leaves it to boto3 (``AWS_ENDPOINT_URL_S3``,
    ``AWS_ENDPOINT_URL``, config files). Any other url raises ValueError naming it.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"invalid storage url {url!r}")
    if not _SCHEME_RE.match(url):
        return LocalFileStorage(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if not url[len(scheme) + 1 :].startswith("//") or parts.query or parts.fragment:
        raise ValueError(f"unsupported storage url {url!r}")
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"unsupported file url {url!r}: use file:///absolute/path")
        return LocalFileStorage(unquote(parts.path))
    if scheme == "s3":
        bucket = parts.netloc
        if not _BUCKET_RE.match(bucket):
            raise ValueError(f"invalid S3 url {url!r}: use s3://bucket[/prefix]")
        return S3Storage(bucket, parts.path.strip("/"), endpoint_url=endpoint_url)
    raise ValueError(f"unsupported storage url {url!r} (use file://, a local path or s3://)")
