"""Kill points for crash tests: a process dies by SIGKILL at a named point of the protocol.

``CUTLINE_FAULT_KILL=<point>`` kills the process group the first time any process of it reaches
``<point>``; ``<point>@<n>`` the ``n``-th time this process reaches it. The points, in protocol
order, are :data:`KILL_POINTS`. Before dying the process writes one line,
``CUTLINE_FAULT killed at <point>``, to stderr, so a test can say where each kill landed.

Without the variable :func:`kill_point` is a dictionary lookup: it costs nothing in production.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections import Counter

ENV = "CUTLINE_FAULT_KILL"

KILL_POINTS = (
    "restore-started",  # the start is planned; no subtask restored yet
    "subtask-restored",  # a subtask's working state is restored (in its Spark task)
    "sink-recovered",  # the restored checkpoint's sink commit is redone
    "batch-applied",  # a subtask applied its records; output not yet staged (Spark task)
    "snapshot-taken",  # a subtask's synchronous snapshot is done; upload in flight (Spark task)
    "metadata-written",  # chk-<n>/_metadata written; the catalog commit not yet made
    "catalog-committed",  # checkpoint n is complete; its sink epochs not yet committed
    "sink-committing",  # the sink's data files are written; its Delta commit not yet made
    "sink-committed",  # the sink commit landed; staged files not yet removed
)

_hits: Counter[str] = Counter()
_lock = threading.Lock()


def kill_point(point: str) -> None:
    """Die here if ``CUTLINE_FAULT_KILL`` names this point (see the module docstring)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, nth = spec.partition("@")
    if name != point:
        return
    with _lock:
        _hits[point] += 1
        hit = _hits[point]
    if hit != int(nth or 1):
        return
    sys.stderr.write(f"CUTLINE_FAULT killed at {point}\n")
    sys.stderr.flush()
    os.killpg(os.getpgid(0), signal.SIGKILL)
