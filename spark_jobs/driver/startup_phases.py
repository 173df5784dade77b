"""Where a driver's start goes: timed phases from its process start to its first micro-batch.

A restart is measured the way a user sees it (the peer benchmark's figure): from the moment the
driver process starts to the end of its first micro-batch. The runtime marks the end of each
phase; the summary line names the slow ones.
"""

from __future__ import annotations

import os
import time


def process_started_monotonic() -> float:
    """This process's start on the ``time.monotonic`` clock (Linux: from ``/proc``; elsewhere
    the time of the first call)."""
    try:
        with open("/proc/self/stat") as f:
            # the command name (field 2) may hold spaces: fields after it follow the last ')'
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        age = max(0.0, uptime - started_after_boot)
    except (OSError, ValueError, IndexError):
        age = 0.0
    return time.monotonic() - age


class StartupTimeline:
    """Phases of a start, each timed from the end of the one before (the first from ``origin``,
    by default the process start; ``since`` names it)."""

    def __init__(self, origin: float | None = None, since: str = "the process start") -> None:
        self.origin = process_started_monotonic() if origin is None else origin
        self.since = since  # what the origin is, in the summary line
        self._last = self.origin
        self.phases: list[tuple[str, float]] = []
        self.overlapped: list[tuple[str, float]] = []  # work done beside the phases, off the path

    def mark(self, phase: str) -> float:
        """Ends ``phase`` now; returns its seconds."""
        now = time.monotonic()
        seconds = now - self._last
        self.phases.append((phase, seconds))
        self._last = now
        return seconds

    def note_overlapped(self, work: str, seconds: float) -> None:
        """``work`` took ``seconds`` on another thread, beside the phases."""
        self.overlapped.append((work, seconds))

    def total_s(self) -> float:
        return self._last - self.origin

    def as_dict(self) -> dict[str, float]:
        out = {name: round(seconds, 3) for name, seconds in self.phases}
        out.update({f"({name})": round(seconds, 3) for name, seconds in self.overlapped})
        return out

    def summary(self) -> str:
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phases)
        beside = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.overlapped)
        return f"{self.total_s():.1f} s from {self.since}: {parts}" + (
            f" (beside them: {beside})" if beside else ""
        )
