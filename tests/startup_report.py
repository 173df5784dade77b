"""Where each slow test's seconds go (a pytest plugin, loaded by ``tests/conftest.py``).

Every driver a test starts through ``tests/e2e_util.py``'s ``cutline`` writes its startup
timeline (``startup: ... s from the process start: spark session ..., query started ...``,
spark_jobs/driver/startup_phases.py) into its log. After each test this plugin reads the lines
its drivers wrote and splits the test's time into the JVM and Spark session, the query's start
(the plan included), the restore, the first micro-batch, and the rest (the runs themselves, the
checks, teardown; drivers that ran at the same time make the phases add up to more than the
test). The table is printed at the end of the run for every test that started a driver and took
longer than ``MIN_S``, and written to ``.cutline-test-timeline.json`` in the project.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

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
    path = line.split(" from the process start: ", 1)[-1].split(" (beside them:")[0]
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
    columns: dict[str, float] = field(default_factory=dict)

    @property
    def rest(self) -> float:
        return self.seconds - sum(self.columns.values())


TIMELINES: list[TestTimeline] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """Around a test's setup, call and teardown: drivers its fixtures start count too."""
    STARTED.clear()
    started = time.monotonic()
    yield
    seconds = time.monotonic() - started
    if not STARTED:
        return
    lines = startup_lines(STARTED)
    columns = dict.fromkeys(COLUMNS, 0.0)
    for line in lines:
        for name, value in phases(line).items():
            columns[name] += value
    TIMELINES.append(TestTimeline(item.nodeid, seconds, len(STARTED), len(lines), columns))
    STARTED.clear()


def pytest_terminal_summary(terminalreporter) -> None:
    shown = sorted((t for t in TIMELINES if t.seconds >= MIN_S), key=lambda t: -t.seconds)
    if not shown:
        return
    terminalreporter.section("where the slow tests' seconds go (drivers' startup timelines)")
    head = f"{'s':>7} {'procs':>7} {'1st mb':>6} " + " ".join(f"{c:>11}" for c in COLUMNS)
    terminalreporter.write_line(f"{head} {'rest':>7}  test")
    for t in shown:
        cells = " ".join(f"{t.columns[c]:11.1f}" for c in COLUMNS)
        counts = f"{t.seconds:7.1f} {t.processes:7d} {t.first_batches:6d}"
        terminalreporter.write_line(f"{counts} {cells} {t.rest:7.1f}  {t.test}")
    total = {c: sum(t.columns[c] for t in shown) for c in COLUMNS}
    terminalreporter.write_line(
        f"all of them: {sum(t.seconds for t in shown):.0f} s, {sum(t.processes for t in shown)} "
        "cutline processes; " + ", ".join(f"{c} {s:.0f} s" for c, s in total.items())
    )
    OUT.write_text(
        json.dumps(
            [
                {
                    "test": t.test,
                    "seconds": round(t.seconds, 1),
                    "processes": t.processes,
                    "first_micro_batches": t.first_batches,
                    **{c: round(t.columns[c], 1) for c in COLUMNS},
                    "rest": round(t.rest, 1),
                }
                for t in shown
            ],
            indent=1,
        )
    )
