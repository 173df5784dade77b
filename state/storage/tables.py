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
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
COMMIT_TOKEN = "cutline_commit"  # commit info key: which plan a conditional commit came from
# Every table Cutline creates: a reader opens a table at its latest log checkpoint and replays
# the commits after it; with a checkpoint every 10 commits (Delta's own default; delta-rs's is
# 100) opening a table costs the same on its thousandth commit as on its tenth. delta-rs cleans
# expired log entries after every commit by listing the whole log, a cost that grows with the
# log retention's worth of commits (a month of checkpoints by default); the tables' owners clean
# the log now and then instead (:meth:`LatestTable.clean_log`).
TABLE_PROPERTIES = {"delta.checkpointInterval": "10", "delta.enableExpiredLogCleanup": "false"}
LOG_CLEANUP_EVERY_S = 300.0  # how often a table's owner removes its expired log entries


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


class LatestTable:
    """One Delta table kept loaded by its owner and brought to its newest version before each
    use: a listing of its log and the commits since the last use, rather than a reload of its
    log checkpoint and a replay of the commits after it (what every :func:`open_table` costs).
    Each use sees exactly what :func:`open_table` would at that moment. Uses are serialised; a
    use inside another on the same thread raises (it would move the outer use's version)."""

    def __init__(self, uri: str | Path) -> None:
        self.uri = str(uri)
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._table: Any | None = None
        self._cleaned_at: float | None = None

    @contextmanager
    def latest(self) -> Iterator[Any]:
        """The table at its newest version for the ``with`` block; raises
        ``deltalake.exceptions.TableNotFoundError`` if there is none."""
        with self._use() as table:
            if table is None:
                from deltalake.exceptions import TableNotFoundError

                raise TableNotFoundError(f"no Delta table at {self.uri}")
            yield table

    @contextmanager
    def find(self) -> Iterator[Any | None]:
        """The table at its newest version for the ``with`` block, or None if there is none."""
        with self._use() as table:
            yield table

    def clean_log(self, every_s: float | None = None) -> bool:
        """Remove the log entries older than the table's log retention that its latest log
        checkpoint made unneeded (a listing of the whole log), unless this handle did so within
        ``every_s`` (:data:`LOG_CLEANUP_EVERY_S`); whether it cleaned. Nothing without a
        table."""
        now = time.monotonic()
        every_s = LOG_CLEANUP_EVERY_S if every_s is None else every_s
        if self._cleaned_at is not None and now - self._cleaned_at < every_s:
            return False
        with self.find() as table:
            if table is None:
                return False
            table.cleanup_metadata()
        self._cleaned_at = now
        return True

    @contextmanager
    def _use(self) -> Iterator[Any | None]:
        if self._owner == threading.get_ident():
            raise RuntimeError(f"{self.uri}: a use of the table inside another on this thread")
        with self._lock:
            self._owner = threading.get_ident()
            try:
                if self._table is None:
                    self._table = find_table(self.uri)
                else:
                    self._table.update_incremental()
                yield self._table
            except BaseException:
                self._table = None  # loaded whole at the next use
                raise
            finally:
                self._owner = None


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
