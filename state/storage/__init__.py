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

import re
from urllib.parse import unquote, urlsplit

from state.errors import BadInputError
from state.redaction import redact
from state.storage.base import (
    AccessError,
    AlreadyExistsError,
    CorruptFileError,
    DurableStorage,
    MissingFileError,
    ObjectInfo,
    StorageError,
)
from state.storage.local import LocalFileStorage
from state.storage.s3 import _BUCKET_RE, S3Storage

__all__ = [
    "AccessError",
    "AlreadyExistsError",
    "CorruptFileError",
    "DurableStorage",
    "LocalFileStorage",
    "MissingFileError",
    "ObjectInfo",
    "S3Storage",
    "StorageError",
    "open_storage",
]

_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def open_storage(url: str, *, endpoint_url: str | None = None) -> DurableStorage:
    """Open storage from a url: ``file:///abs``, a local path, or ``s3://bucket[/prefix]``.

    ``endpoint_url`` applies to S3 only; None leaves it to boto3 (``AWS_ENDPOINT_URL_S3``,
    ``AWS_ENDPOINT_URL``, config files). Any other url raises a ``BadInputError``
    naming it.
    """
    if not isinstance(url, str) or not url.strip():
        raise BadInputError(f"invalid storage url {redact(url)!r}")
    if not _SCHEME_RE.match(url):
        return LocalFileStorage(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if not url[len(scheme) + 1 :].startswith("//") or parts.query or parts.fragment:
        raise BadInputError(f"unsupported storage url {redact(url)!r}")
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise BadInputError(f"unsupported file url {redact(url)!r}: use file:///absolute/path")
        return LocalFileStorage(unquote(parts.path))
    if scheme == "s3":
        bucket = parts.netloc
        if not _BUCKET_RE.match(bucket):
            raise BadInputError(f"invalid S3 url {redact(url)!r}: use s3://bucket[/prefix]")
        return S3Storage(bucket, parts.path.strip("/"), endpoint_url=endpoint_url)
    raise BadInputError(
        f"unsupported storage url {redact(url)!r} (use file://, a local path or s3://)"
    )
