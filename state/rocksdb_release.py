"""Releasing a working database once its background compactions end, and opening one whose
lock is still held by such a release.

RocksDB starts a level-0 compaction when a task opens a store, and closing the database cancels
a running compaction and discards its work: with tasks shorter than their compactions, none would
complete and level 0 would grow by a file per task until writes stall. A task that waited for the
compaction instead would take its seconds (five at a GiB of state) on the micro-batch's critical
path. So a task ends by :func:`release_after_compactions`: its writes are flushed to SST files
before it returns, and the database stays open on a thread of the task's process until no
compaction runs, then closes. The next opener of the same directory, in this process or another
(Spark moves tasks between Python workers), waits for the lock (:func:`open_when_released`). A
process that dies meanwhile loses only the compaction's work, which the next open starts again.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from pathlib import Path

import rocksdict as rd

LOCK_WAIT_S = 600.0  # an opener waits this long for a lock held by a release, then fails
POLL_S = 0.005


class _Release:
    """One database closing once its compactions end; :meth:`close_now` cancels them."""

    def __init__(self, db: rd.Rdict, path: Path) -> None:
        self.db: rd.Rdict | None = db
        self.path = path
        self.lock = threading.Lock()  # the thread's polls against close_now
        self.thread = threading.Thread(
            target=self._run, name=f"cutline-release-{path.name}", daemon=True
        )

    def _run(self) -> None:
        try:
            while True:
                with self.lock:
                    if self.db is None:
                        return
                    try:
                        running = self.db.property_int_value("rocksdb.num-running-compactions")
                    except Exception:
                        running = 0  # a database that cannot say is closed all the same
                    if not running:
                        self._close()
                        return
                time.sleep(POLL_S)
        finally:
            with _RELEASING_LOCK:
                if _RELEASING.get(self.path) is self:
                    del _RELEASING[self.path]

    def close_now(self) -> None:
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self.db is not None:
            db, self.db = self.db, None
            db.close()


_RELEASING: dict[Path, _Release] = {}  # this process's releases in progress, by directory
_RELEASING_LOCK = threading.Lock()


def release_after_compactions(db: rd.Rdict, path: Path) -> threading.Thread | None:
    """Close ``db`` (at ``path``, its memtable flushed by the caller) once no background
    compaction runs: at once when none does (None), otherwise on a thread of this process,
    returned."""
    if not db.property_int_value("rocksdb.num-running-compactions"):
        db.close()
        return None
    release = _Release(db, Path(path))
    with _RELEASING_LOCK:
        _RELEASING[release.path] = release
    release.thread.start()
    return release.thread


def open_when_released(
    path: Path, open_db: Callable[[], rd.Rdict], wait_s: float = LOCK_WAIT_S
) -> rd.Rdict:
    """``open_db()``, retried while the database's lock is held (by a release of this process
    or another's) for up to ``wait_s``; any other failure, or the lock still held then, raises
    the open's error."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return open_db()
        except Exception as e:
            if not _lock_held(e) or time.monotonic() > deadline:
                raise
        with _RELEASING_LOCK:
            release = _RELEASING.get(Path(path))
        if release is not None:
            release.thread.join(max(0.0, deadline - time.monotonic()))
        else:
            time.sleep(POLL_S * 10)


def _lock_held(error: Exception) -> bool:
    """RocksDB's open failed on the directory's LOCK file: held by this process ("lock hold by
    current process") or another ("Resource temporarily unavailable")."""
    return "/LOCK:" in str(error)


@atexit.register
def _close_releases_at_exit() -> None:
    """A process that exits through the interpreter closes its databases first (their
    compactions cancelled): RocksDB's threads must not outlive its objects. PySpark's workers
    end with ``os._exit`` and skip this, which loses only the compactions' work."""
    with _RELEASING_LOCK:
        releases = list(_RELEASING.values())
    for release in releases:
        release.close_now()
