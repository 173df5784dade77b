"""Helpers for end-to-end tests that run `cutline` as real processes and kill them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from spark_jobs.catalog.tables import read_delta
from spark_jobs.events import EVENT_LINE
from tests import findings
from tests.startup_report import driver_started

ROOT = Path(__file__).resolve().parent.parent


def report(line: str) -> None:
    """A figure a test measured (kills, records, keys compared): printed, and listed again
    under "figures" at the end of the pytest run, passing or not (tests/findings.py)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].split("/")[-1]
    findings.note("figure", f"{test}: {line.strip()}" if test else line.strip())
    print(line)


def cutline(
    home: Path,
    *args: str,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    view: Callable[[list[str]], list[str]] | None = None,
):
    """Start ``cutline --home HOME ARGS`` in its own process group (driver and its JVM);
    ``view`` wraps the command (a private view of the disks: StandaloneCluster.driver_view)."""
    home.mkdir(parents=True, exist_ok=True)
    log = log or home / "driver.log"
    driver_started(log)
    out = open(log, "ab")  # noqa: SIM115 - owned by the process
    command = [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), *args]
    return subprocess.Popen(
        view(command) if view else command,
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


def active_driver(log: str) -> int:
    """The active driver's pid, from the last "drivers" event in a standby supervisor's ``log``
    (``CUTLINE_EVENTS=stdout``)."""
    events = [json.loads(line[len(EVENT_LINE) :]) for line in log.splitlines()
              if line.startswith(EVENT_LINE)]  # fmt: skip
    return [e["active"] for e in events if e["kind"] == "drivers"][-1]


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


def run_to_end(
    home: Path, *args: str, timeout: float = 600, env=None, rc: int = 0, view=None
) -> None:
    """Run ``cutline`` to its end; it must exit ``rc``."""
    got = finish(cutline(home, *args, env=env, view=view), timeout)
    log = (home / "driver.log").read_text(errors="replace")
    assert got == rc, f"cutline {' '.join(args)} exited {got}, not {rc}:\n{log[-6000:]}"


def catalog_table(home: Path, table: str) -> Path:
    return home / "warehouse" / "catalog" / table


def completed_checkpoints(home: Path, job: str) -> list[dict]:
    """The job's rows of ``completed_checkpoints``, strictly: a catalog that cannot be read
    fails the test (an assertion over no rows would hold vacuously)."""
    return read_delta(catalog_table(home, "completed_checkpoints"), job).to_pylist()


def checkpoints_so_far(home: Path, job: str) -> list[dict]:
    """For waiting on a starting run: no rows while the table has no commit yet; any other
    failure to read it fails the test."""
    try:
        return completed_checkpoints(home, job)
    except TableNotFoundError:
        return []


def first_version(table: Path, app: str, at_least: int) -> int:
    """The first version of a Delta table whose app transaction ``app`` is at least
    ``at_least``: the commit in which a fence went up."""
    latest = DeltaTable(str(table)).version()
    low, high = 0, latest + 1
    while low < high:  # transaction versions only grow with the table's versions
        middle = (low + high) // 2
        recorded = DeltaTable(str(table), version=middle).transaction_version(app)
        if recorded is not None and recorded >= at_least:
            high = middle
        else:
            low = middle + 1
    assert low <= latest, f"{table}: {app} never reached {at_least}"
    return low


def committed_after_fence(home: Path, job: str, sinks: dict[str, str], old: int, new: int) -> list:
    """What attempt ``old`` committed after attempt ``new`` fenced it, in Delta commit order:
    checkpoint rows added to ``completed_checkpoints`` after the version holding ``new``'s fence,
    and commits to each sink's table (``sinks``: sink name -> table) after the version holding
    ``new``'s fence of that sink."""
    path = catalog_table(home, "completed_checkpoints")
    fenced = first_version(path, f"cutline-{job}", new << 32)

    def old_ids(table) -> set[int]:
        rows = read_delta(table, job, ["attempt", "checkpoint_id"]).to_pylist()
        return {r["checkpoint_id"] for r in rows if r["attempt"] == old}

    late: list = sorted(old_ids(path) - old_ids(DeltaTable(str(path), version=fenced - 1)))
    for sink, name in sinks.items():
        table = home / "warehouse" / "tables" / name
        since = first_version(table, f"cutline-fence-{job}-{sink}", new)
        for entry in DeltaTable(str(table)).history():
            info = json.loads(entry.get("cutline") or "{}")
            if entry["version"] > since and info.get("attempt") == old:
                late.append(f"{sink} version {entry['version']}: epochs {sorted(info['epochs'])}")
    return late


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def gc_left_only_what_is_needed(paths, job: str) -> list[int]:
    """After a GC pass with no grace over a job that is not running: storage under the job's
        root holds exactly the retained checkpoints' manifests and the files they reference (and the
    claims of ids above them, which GC keeps), each
        of those checkpoints verifies (checksums included), and the registry's LIVE rows are the
        shared files stored. Returns the retained checkpoint ids."""
    from spark_jobs.catalog.tables import CatalogReader
    from state.catalog import CheckpointStatus
    from state.paths import JobLayout
    from state.restore import read_manifest, validate_checkpoint
    from state.storage import open_storage

    storage = open_storage(paths.checkpoint_root)
    reader = CatalogReader(paths.catalog)
    kept = reader.checkpoints(job, (CheckpointStatus.COMPLETED,))
    needed = set()
    for row in kept:
        manifest = read_manifest(storage, row.metadata_path)
        problems = validate_checkpoint(manifest, storage, checksums=True)
        assert not problems, f"checkpoint {row.checkpoint_id}: {problems}"
        needed |= {f"{job}/{p}" for p in manifest.referenced_paths()} | {row.metadata_path}
    stored = {i.path for i in storage.list(job)}
    newest = max((row.checkpoint_id for row in kept), default=0)
    claims = {  # of ids above every retained one: kept, so no newer attempt reuses them
        p
        for p in stored
        if p.endswith(f"/{JobLayout.CLAIM}")
        and (JobLayout.checkpoint_id_of(p.split("/", 1)[1]) or 0) > newest
    }
    assert stored - claims == needed, (sorted(stored - needed)[:10], sorted(needed - stored)[:10])
    rows = reader.shared_files(job)
    assert {f"{job}/{r['path']}" for r in rows if r["status"] == "LIVE"} == {
        p for p in stored if p.startswith(f"{job}/shared/")
    }
    assert all(r["deleted_at_ms"] for r in rows if r["status"] == "DELETED")
    return [row.checkpoint_id for row in kept]


def completed_checkpoints_at(paths, job: str) -> list[dict]:
    """The job's rows of ``completed_checkpoints`` in the catalog of ``paths`` (any root)."""
    from state.storage.tables import table_uri

    return read_delta(table_uri(paths.catalog, "completed_checkpoints"), job).to_pylist()


def verify_retained(paths, job: str) -> list[int]:
    """Every COMPLETED checkpoint of ``job`` validates, checksums included; returns their ids."""
    from spark_jobs.catalog.tables import CatalogReader
    from state.catalog import CheckpointStatus
    from state.restore import read_manifest, validate_checkpoint
    from state.storage import open_storage

    storage = open_storage(paths.checkpoint_root)
    ids = []
    for row in CatalogReader(paths.catalog).checkpoints(job, (CheckpointStatus.COMPLETED,)):
        problems = validate_checkpoint(
            read_manifest(storage, row.metadata_path), storage, checksums=True
        )
        assert not problems, f"checkpoint {row.checkpoint_id}: {problems}"
        ids.append(row.checkpoint_id)
    return ids
