"""Durable storage on S3 through boto3 (credentials only through boto3's chain): conditional
writes for exclusive creates, multipart uploads, size-checked downloads."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from state.errors import BadInputError
from state.paths import check_relative
from state.storage.base import (
    AccessError,
    AlreadyExistsError,
    DurableStorage,
    MissingFileError,
    ObjectInfo,
    StorageError,
    remove_quietly,
    tmp_name,
)

_S3_TAKEN_CODES = ("PreconditionFailed", "ConditionalRequestConflict")
_S3_MIN_PART = 5 * 2**20
_S3_DELETE_BATCH = 1000
_S3_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
# the storage refuses this process: not transient (AccessError)
_S3_ACCESS_CODES = frozenset(
    {
        "NoSuchBucket",
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "AccountProblem",
        "403",
    }
)


# what a boto3 client's endpoint, region and credentials come from when not given
_CLIENT_ENV = (
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)
_clients: dict[tuple, Any] = {}
_clients_lock = threading.Lock()


def _shared_client(endpoint_url: str | None, region_name: str | None, max_attempts: int) -> Any:
    """One boto3 S3 client per process and configuration, shared by every storage opened with
    it: a client takes 0.2-0.4 s to make, and executors open storage for every ack, staged part
    and snapshot. Clients are thread-safe; the key holds the process id (a forked worker makes
    its own) and the environment the client was made from (a changed endpoint or credential
    gets a new one). Credentials stay where boto3's chain found them."""
    key = (
        os.getpid(),
        endpoint_url,
        region_name,
        max_attempts,
        hashlib.sha256("\0".join(os.environ.get(v, "") for v in _CLIENT_ENV).encode()).digest(),
    )
    with _clients_lock:
        client = _clients.get(key)
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
            _clients[key] = client
        return client


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


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
            raise BadInputError(f"invalid S3 bucket name {bucket!r}")
        if max_attempts < 1:
            raise BadInputError(f"max_attempts must be >= 1, got {max_attempts}")
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
        self._client = client or _shared_client(endpoint_url, region_name, max_attempts)

    def _key(self, path: str) -> str:
        return self._key_prefix + check_relative(path)

    def _error(self, exc: Exception, action: str, path: str) -> StorageError:
        from botocore.exceptions import ClientError, NoCredentialsError

        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code in _S3_MISSING_CODES:
                return self._missing(path)
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            message = error.get("Message") or ""
            detail = f"{code} (HTTP {status}) {message}".strip()
            if code in _S3_ACCESS_CODES:
                return AccessError(
                    f"cannot {action} {path!r} in {self.url}: {detail}", path=path, url=self.url
                )
            return self._failed(action, path, detail)
        if isinstance(exc, NoCredentialsError):
            return AccessError(
                f"cannot {action} {path!r} in {self.url}: no credentials (boto3's chain found "
                "none: environment, profile, instance role)",
                path=path,
                url=self.url,
            )
        return self._failed(action, path, f"{type(exc).__name__}: {exc}")

    def probe(self) -> None:
        try:
            self._client.list_objects_v2(Bucket=self.bucket, Prefix=self._key_prefix, MaxKeys=1)
        except self._errors() as exc:
            raise self._error(exc, "list", ".") from exc

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
            if exclusive and _error_code(exc) in _S3_TAKEN_CODES:
                if self._holds(path, data):  # a retry found its own first try's object
                    return
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
        tmp = dest.parent / tmp_name()
        try:
            self._client.download_file(self.bucket, key, os.fspath(tmp), Config=self._transfer)
            size = tmp.stat().st_size
            self._check_size(path, expected_size, size)
            os.replace(tmp, dest)
        except self._errors() as exc:
            raise self._error(exc, "fetch", path) from exc
        finally:
            remove_quietly(tmp)
        return size

    def copy_to(
        self, path: str, target: DurableStorage, target_path: str, expected_size: int | None = None
    ) -> int:
        """Inside S3 (CopyObject, multipart above the threshold: no byte passes through this
        process) when ``target`` is on the same S3 service, whatever its bucket or prefix."""
        same_service = isinstance(target, S3Storage) and (
            target._client.meta.endpoint_url == self._client.meta.endpoint_url
        )
        if not same_service:
            return super().copy_to(path, target, target_path, expected_size)
        size = self.stat(path).size
        self._check_size(path, expected_size, size)
        source = {"Bucket": self.bucket, "Key": self._key(path)}
        try:
            self._client.copy(
                source, target.bucket, target._key(target_path), Config=self._transfer
            )
        except self._errors() as exc:
            raise target._error(exc, f"copy {self.url}/{path} to", target_path) from exc
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
