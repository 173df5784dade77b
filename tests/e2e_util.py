"""Helpers for end-to-end tests that run `cutline` as real processes and kill them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from deltalake.exceptions import TableNotFoundError

from spark_jobs.catalog.tables import read_delta

ROOT = Path(__file__).resolve().parent.parent
FIGURES: list[str] = []  # what tests measured; conftest.py repeats them at the end of the run


def report(line: str) -> None:
    """A figure a test measured (kills, records, keys compared): printed, and listed again
    under "figures" at the end of the pytest run, passing or not."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].split("/")[-1]
    FIGURES.append(f"{test}: {line.strip()}" if test else line.strip())
    print(line)


def cutline(home: Path, *args: str, env: dict[str, str] | None = None, log: Path | None = None):
    """Start ``cutline --home HOME ARGS`` in its own process group (driver and its JVM)."""
    home.mkdir(parents=True, exist_ok=True)
    out = open(log or home / "driver.log", "ab")  # noqa: SIM115 - owned by the process
    return subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.cli", "--home", str(home), *args],
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def kill_driver(proc: subprocess.Popen) -> None:
    """``kill -9`` of the driver and everything it started (the Spark JVM and its workers)."""
    with contextlib.suppress(ProcessLookupError):  # it may have died on its own meanwhile
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def finish(proc: subprocess.Popen, timeout: float = 600) -> int:
    """Wait for a driver to end; kill it (and fail) if it does not within ``timeout``."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_driver(proc)
        raise


def last_line(home: Path, log: str = "driver.log") -> str:
    """The last line a driver wrote (``cutline: ...`` when it failed)."""
    lines = (home / log).read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def run_to_end(home: Path, *args: str, timeout: float = 600, env=None, rc: int = 0) -> None:
    """Run ``cutline`` to its end; it must exit ``rc``."""
    got = finish(cutline(home, *args, env=env), timeout)
    log = (home / "driver.log").read_text(errors="replace")
    assert got == rc, f"cutline {' '.join(args)} exited {got}, not {rc}:\n{log[-6000:]}"


def table_rows(path: Path, columns: list[str] | None = None) -> list[tuple]:
    try:
        data = read_delta(path, columns=columns)
    except TableNotFoundError:  # not created yet
        return []
    return sorted(zip(*(data.column(c).to_pylist() for c in data.column_names), strict=True))


def completed_checkpoints(home: Path, job: str) -> list[dict]:
    path = home / "warehouse" / "catalog" / "completed_checkpoints"
    if not (path / "_delta_log").is_dir():
        return []
    try:
        rows = read_delta(path, job).to_pylist()
    except Exception:  # the table is being created
        return []
    return [r for r in rows if r["job_id"] == job]


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
