"""Delta tables under a storage URL, read and committed with delta-rs.

A role's root (the catalog, the output tables) is a local path, ``file:///abs`` or
``s3://bucket/prefix``; :func:`table_uri` names a table under it and :func:`open_table` /
:func:`storage_options` give delta-rs what it needs to reach it.

Commits on S3 are safe with any number of concurrent writers in any number of processes: delta-rs
commits version *v* by creating ``_delta_log/<v>.json`` with ``If-None-Match: *``, and S3's
conditional write lets exactly one writer of a version succeed; the others get a commit conflict
and plan again (no lock table). That holds only while every writer commits this way, which is why
no catalog or output table is ever written through delta-spark, whose S3 log store is safe for a
single writing process only.

The endpoint and region come from the environment boto3 reads too (``AWS_ENDPOINT_URL_S3``, else
``AWS_ENDPOINT_URL``; ``AWS_REGION``, else ``AWS_DEFAULT_REGION``); credentials never pass through
here: delta-rs finds them through the AWS chain.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
COMMIT_TOKEN = "cutline_commit"  # commit info key: which plan a conditional commit came from


def is_url(root: str | Path) -> bool:
    """Whether ``root`` is a URL (``s3://``, ``file://``) rather than a local path."""
    return bool(_URL_RE.match(str(root)))


def join_url(root: str | Path, *parts: str) -> str:
    """``parts`` under ``root``: '/'-joined for a URL, a path join for a local path."""
    if is_url(root):
        return "/".join([str(root).rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(root).joinpath(*parts))


def table_uri(root: str | Path, name: str) -> str:
    """The URI of table ``name`` under the role root ``root``."""
    return join_url(root, name)


def storage_options(uri: str) -> dict[str, str] | None:
    """What delta-rs needs to reach ``uri`` besides credentials (None for local tables)."""
    if not str(uri).lower().startswith(("s3://", "s3a://")):
        return None
    options: dict[str, str] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.lower().startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["AWS_REGION"] = region
    return options


def open_table(uri: str | Path, version: int | None = None) -> Any:
    """The ``deltalake.DeltaTable`` at ``uri`` (its latest version, or ``version``); raises
    ``deltalake.exceptions.TableNotFoundError`` if there is none."""
    from deltalake import DeltaTable

    return DeltaTable(str(uri), version=version, storage_options=storage_options(str(uri)))


def find_table(uri: str | Path) -> Any | None:
    """The table at ``uri``, or None if there is none yet."""
    from deltalake.exceptions import TableNotFoundError

    try:
        return open_table(uri)
    except TableNotFoundError:
        return None


def write_table(target: Any, data: Any, **kwargs: Any) -> None:
    """``deltalake.write_deltalake`` to ``target`` (a URI, or a loaded ``DeltaTable`` whose
    version the commit is planned on), reaching a URI as :func:`open_table` does."""
    from deltalake import DeltaTable, write_deltalake

    if not isinstance(target, DeltaTable):
        target = str(target)
        kwargs.setdefault("storage_options", storage_options(target))
    write_deltalake(target, data, **kwargs)


def committed_since(uri: str | Path, version: int, token: str) -> bool:
    """Whether a commit after ``version`` of the table at ``uri`` carries ``token`` under
    :data:`COMMIT_TOKEN` in its commit info: how a writer whose commit failed tells whether
    its own commit landed after all (object storage kept the log entry, the answer was lost,
    and the retry found the entry taken)."""
    table = open_table(uri)
    newer = table.version() - version
    if newer <= 0:
        return False
    return any(entry.get(COMMIT_TOKEN) == token for entry in table.history(newer))
