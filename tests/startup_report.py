"""Where each slow test's seconds go (a pytest plugin, loaded by ``tests/conftest.py``).

Every driver a test starts through ``tests/e2e_util.py``'s ``cutline`` writes its startup
timeline (``startup: ... s from the process start: spark session ..., query started ...``,
spark_jobs/driver/startup_phases.py) into its log. After each test this plugin reads the lines
its drivers wrote and splits the test's time into the JVM and Spark session, the query's start
(the plan included), the restore, the first micro-batch, and the rest (the runs themselves, the
checks, teardown; drivers that ran at the same time make the phases add up to more than the
test). Beside them, how many of the machine's cores were busy on average during the test (from
``/proc/stat``: a test near the core count waits on the CPU, one far below it waits on time).
The table is printed at the end of the run for every test that took longer than ``MIN_S``, and
written to ``.cutline-test-timeline.json`` in the project.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import findings

MIN_S = 20.0
OUT = Path(__file__).resolve().parent.parent / ".cutline-test-timeline.json"
# the runtime's phase names (spark_jobs/driver/run.py, commands/handlers.py) -> the report's
GROUPS = {
    "spark session": "session",
    "attempt and checkpoint": "query start",
    "waiting for the plan": "query start",
    "query started": "query start",
    "state restored": "restore",
    "first trigger planned": "first batch",
    "first micro-batch": "first batch",
}
COLUMNS = ("session", "query start", "restore", "first batch")
PHASE = re.compile(r"([a-z][a-z -]*?) (\d+(?:\.\d+)?) s")

STARTED: list[tuple[Path, int]] = []  # (log, its size when the driver started), this test's


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every core since boot; (0, 0) where /proc is not."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # idle and iowait are not busy


def busy_cores(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The average number of busy cores between two :func:`cpu_ticks`."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total * (os.cpu_count() or 1) if total > 0 else 0.0


def driver_started(log: Path) -> None:
    """A driver writing to ``log`` starts now (called by ``tests/e2e_util.py``)."""
    STARTED.append((log, log.stat().st_size if log.exists() else 0))


def startup_lines(started: list[tuple[Path, int]]) -> list[str]:
    """The startup lines the drivers of ``started`` wrote, each log read once from the first
    offset a driver started at."""
    first: dict[Path, int] = {}
    for log, offset in started:
        first[log] = min(offset, first.get(log, offset))
    lines = []
    for log, offset in first.items():
        if log.exists():
            with open(log, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
            lines += [ln for ln in text.splitlines() if ln.startswith("startup: ")]
    return lines


def phases(line: str) -> dict[str, float]:
    """One startup line's seconds per report column (phases beside the path not counted)."""
    path = re.split(r" s from [^:]+: ", line, maxsplit=1)[-1].split(" (beside them:")[0]
    out = dict.fromkeys(COLUMNS, 0.0)
    for name, seconds in PHASE.findall(path):
        column = GROUPS.get(name.strip())
        if column is not None:
            out[column] += float(seconds)
    return out


@dataclass
class TestTimeline:
    test: str
    seconds: float
    processes: int
    first_batches: int
    cores: float  # busy on average during the test
    columns: dict[str, float] = field(default_factory=dict)

    @property
    def rest(self) -> float:
        return self.seconds - sum(self.columns.values())

    def to_dict(self) -> dict:
        return {
            "test": self.test,
            "seconds": round(self.seconds, 1),
            "cores_busy": round(self.cores, 2),
            "processes": self.processes,
            "first_micro_batches": self.first_batches,
            **{c: round(self.columns[c], 1) for c in COLUMNS},
            "rest": round(self.rest, 1),
        }

    @classmethod
    def from_dict(cls, d: dict) -> TestTimeline:
        columns = {c: d[c] for c in COLUMNS}
        return cls(d["test"], d["seconds"], d["processes"], d["first_micro_batches"],
                   d["cores_busy"], columns)  # fmt: skip


BEGAN: list[tuple[float, tuple[int, int]]] = []  # when the running test began, and the CPU's


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test begins: drivers its fixtures start count too."""
    STARTED.clear()
    BEGAN[:] = [(time.monotonic(), cpu_ticks())]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """At the end of a test's teardown: its timeline, on its report (tests/findings.py)."""
    outcome = yield
    if call.when != "teardown" or not BEGAN:
        return
    (started, ticks) = BEGAN.pop()
    seconds = time.monotonic() - started
    if seconds < MIN_S:
        return
    lines = startup_lines(STARTED)
    columns = dict.fromkeys(COLUMNS, 0.0)
    for line in lines:
        for name, value in phases(line).items():
            columns[name] += value
    cores = busy_cores(ticks, cpu_ticks())
    timeline = TestTimeline(item.nodeid, seconds, len(STARTED), len(lines), cores, columns)
    findings.on_report(outcome.get_result(), "timeline", timeline.to_dict())
    STARTED.clear()


def pytest_terminal_summary(terminalreporter) -> None:
    timelines = [TestTimeline.from_dict(d) for d in findings.collected("timeline")]
    shown = sorted(timelines, key=lambda t: -t.seconds)
    if not shown:
        return
    terminalreporter.section("where the slow tests' seconds go (drivers' startup timelines)")
    head = f"{'s':>7} {'cores':>5} {'procs':>5} {'1st mb':>6} " + " ".join(
        f"{c:>11}" for c in COLUMNS
    )
    terminalreporter.write_line(f"{head} {'rest':>7}  test")
    for t in shown:
        cells = " ".join(f"{t.columns[c]:11.1f}" for c in COLUMNS)
        counts = f"{t.seconds:7.1f} {t.cores:5.2f} {t.processes:5d} {t.first_batches:6d}"
        terminalreporter.write_line(f"{counts} {cells} {t.rest:7.1f}  {t.test}")
    total = {c: sum(t.columns[c] for t in shown) for c in COLUMNS}
    seconds = sum(t.seconds for t in shown)
    cores = sum(t.cores * t.seconds for t in shown) / seconds
    terminalreporter.write_line(
        f"all of them: {seconds:.0f} s, {cores:.2f} cores busy, "
        f"{sum(t.processes for t in shown)} "
        "cutline processes; " + ", ".join(f"{c} {s:.0f} s" for c, s in total.items())
    )
    OUT.write_text(json.dumps([t.to_dict() for t in shown], indent=1))
