"""Kill points for crash tests: a process dies by SIGKILL at a named point of the protocol.

``CUTLINE_FAULT_KILL=<point>`` kills the driver's process group the first time one of its processes
reaches ``<point>``; ``<point>@<n>`` the ``n``-th time that process reaches it. With
``CUTLINE_FAULT_KILL_AFTER=<file>`` only the times after that file exists count (a test arms the
point when it is ready: a standby warm, say). The points, in protocol order, are
:data:`KILL_POINTS`, and a savepoint's :data:`SAVEPOINT_KILL_POINTS`. Some are
reached in Spark's Python workers, which PySpark runs in process groups of their own:
:func:`arm`, called by the driver before it starts Spark, puts its own process group into the
environment they inherit, so a kill anywhere takes the whole driver down, as a crash of its host
would. Before dying the process writes one line, ``CUTLINE_FAULT killed at <point>``, to stderr
and, when ``CUTLINE_FAULT_RECORD`` names a file, appends it there: a Python worker's stderr
reaches the log through its JVM, which the kill can take down before it copies the line, so a
test tells where each kill landed from the file. Slowed uploads (``CUTLINE_FAULT_UPLOAD_DELAY_S``)
note there when each upload starts and ends (:func:`note`), so a test can kill while one is
pending and tell that it was.

Without the variable :func:`kill_point` is a dictionary lookup: it costs nothing in production.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import Executor, Future

ENV = "CUTLINE_FAULT_KILL"
AFTER_ENV = "CUTLINE_FAULT_KILL_AFTER"  # a file: the point counts only once it exists
GROUP_ENV = "CUTLINE_FAULT_KILL_GROUP"  # the driver's process group, set by arm()
RECORD_ENV = "CUTLINE_FAULT_RECORD"  # a file each kill appends its line to before dying
UPLOAD_DELAY_ENV = "CUTLINE_FAULT_UPLOAD_DELAY_S"  # seconds every snapshot upload starts late

KILL_POINTS = (
    "restore-started",  # the start is planned; no subtask restored yet
    "subtask-restored",  # a subtask's working state is restored (in its Spark task)
    "sink-recovered",  # the restored checkpoint's sink commit is redone
    "batch-applied",  # a subtask applied its records; output not yet staged (Spark task)
    "snapshot-taken",  # a subtask's synchronous snapshot is done; upload in flight (Spark task)
    "metadata-written",  # chk-<n>/_metadata written; the catalog commit not yet made
    "catalog-committed",  # checkpoint n is complete; its sink epochs not yet committed
    "sink-committing",  # the sink's commit is planned; its data files and Delta commit not yet
    "sink-committed",  # the sink commit landed; staged files not yet removed
)
# points of a savepoint's life (reached only while a savepoint is written or imported)
SAVEPOINT_KILL_POINTS = (
    "savepoint-copying",  # a file of the savepoint is copied; others and _metadata not yet
    "savepoint-written",  # the savepoint's _metadata is written; its catalog row not yet
    "savepoint-recorded",  # its catalog row is recorded; the request not yet cleared
    "savepoint-importing",  # a file of a savepoint restored is copied into the job's directory
    "savepoint-imported",  # the imported checkpoint's _metadata is written; not yet committed
)

_hits: Counter[str] = Counter()
_lock = threading.Lock()


def arm() -> None:
    """In the driver, before Spark starts: kill points of its Spark workers kill its process
    group."""
    if os.environ.get(ENV):
        os.environ.setdefault(GROUP_ENV, str(os.getpgid(0)))


def for_driver(environ: dict[str, str], armed: bool) -> dict[str, str]:
    """The environment of a driver that another process (a standby supervisor) launches: its
    kill points take its own process group, not its launcher's (its :func:`arm` sets that); not
    ``armed``, it has no kill point at all (a standby, whose takeover must not die where the
    driver it replaces was told to)."""
    dropped = (GROUP_ENV,) if armed else (GROUP_ENV, ENV)
    return {k: v for k, v in environ.items() if k not in dropped}


def kill_point(point: str) -> None:
    """Die here if ``CUTLINE_FAULT_KILL`` names this point (see the module docstring)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, nth = spec.partition("@")
    if name != point:
        return
    after = os.environ.get(AFTER_ENV)
    if after and not os.path.exists(after):  # not armed yet: this time does not count
        return
    with _lock:
        _hits[point] += 1
        hit = _hits[point]
    if hit != int(nth or 1):
        return
    line = f"CUTLINE_FAULT killed at {point}\n"
    sys.stderr.write(line)
    sys.stderr.flush()
    note(line)  # before the kill: the line is in the file when we die
    group = int(os.environ.get(GROUP_ENV) or os.getpgid(0))
    if group != os.getpgid(0):
        os.killpg(group, signal.SIGKILL)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def note(line: str) -> None:
    """Append ``line`` to the file ``CUTLINE_FAULT_RECORD`` names, if any: one append(2), so
    lines of many processes never interleave."""
    record = os.environ.get(RECORD_ENV)
    if record:
        fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


class DelayedExecutor(Executor):
    """The asynchronous part of every snapshot starts ``delay_s`` late, so tests can kill a
    driver while uploads are in flight; each upload's start and end are noted (:func:`note`)."""

    def __init__(self, delay_s: float) -> None:
        from state.snapshot import default_executor

        self.delay_s = delay_s
        self.inner = default_executor()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        def delayed():
            token = uuid.uuid4().hex
            note(f"upload started {token}\n")
            time.sleep(self.delay_s)
            try:
                return fn(*args, **kwargs)
            finally:
                note(f"upload ended {token}\n")

        return self.inner.submit(delayed)


def upload_executor() -> Executor | None:
    """Where a subtask's snapshot uploads run: a :class:`DelayedExecutor` when
    ``CUTLINE_FAULT_UPLOAD_DELAY_S`` is set, otherwise None (the snapshotter's default)."""
    delay = float(os.environ.get(UPLOAD_DELAY_ENV, "0") or 0)
    return DelayedExecutor(delay) if delay > 0 else None
