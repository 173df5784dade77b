"""Exactly-once, shown: the driver is killed with SIGKILL twice (once with uploads in flight),
restored from the latest checkpoint each time, and the final Delta output equals the output of an
uninterrupted run: no record lost, none duplicated."""

from __future__ import annotations

import json
import shutil
import socket
from collections import Counter
from pathlib import Path

import pytest

from spark_jobs.generate import generate
from state.manifest import CheckpointManifest
from tests.e2e_util import (
    completed_checkpoints,
    cutline,
    kill_driver,
    run_to_end,
    table_rows,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.spark]

JOB = "clicks_per_user"
HOST = socket.gethostname()
IDLE = "8"
# Input per job: (kind, records per partition); sources read 20,000 orders or clicks (5,000
# profiles) per partition and micro-batch.
INPUTS = {
    "clicks_per_user": [("clicks", 200_000)],
    "windowed_revenue": [("orders", 120_000)],
    "enriched_orders": [("orders", 120_000), ("profiles", 30_000)],
}
TABLES = {
    "clicks_per_user": "clicks_per_user",
    "windowed_revenue": "windowed_revenue",
    "enriched_orders": "enriched_orders",
}


def make_home(base: Path, name: str, job: str = JOB) -> Path:
    home = base / name
    for kind, count in INPUTS[job]:
        generate(home / "log", kind, kind, count=count, seed=7, users=20_000)
    return home


def output(home: Path, job: str = JOB) -> list[tuple]:
    return table_rows(home / "warehouse" / "tables" / TABLES[job])


_references: dict[str, list[tuple]] = {}


def reference_output(job: str, base: Path) -> list[tuple]:
    """Output of an uninterrupted run of ``job`` (computed once per test session)."""
    if job not in _references:
        home = make_home(base, f"reference-{job}", job)
        run_to_end(home, "run", job, "--idle-timeout", IDLE)
        _references[job] = output(home, job)
        assert _references[job], f"the reference run of {job} wrote output"
    return _references[job]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[tuple]:
    return reference_output(JOB, tmp_path_factory.mktemp("reference"))


@pytest.mark.parametrize("job", list(INPUTS))
def test_driver_killed_twice_gives_exactly_the_reference_output(job, tmp_path_factory, tmp_path):
    reference = reference_output(job, tmp_path_factory.mktemp("reference"))
    home = make_home(tmp_path, "home", job)
    # 1st attempt: killed once two checkpoints have completed.
    proc = cutline(home, "run", job, "--idle-timeout", IDLE)
    wait_for(lambda: len(completed_checkpoints(home, job)) >= 2, 300, "2 checkpoints", proc)
    kill_driver(proc)

    # 2nd attempt: restores, then is killed while snapshot uploads are in flight.
    slow_uploads = {"CUTLINE_FAULT_UPLOAD_DELAY_S": "4"}
    proc = cutline(home, "run", job, "--idle-timeout", IDLE, env=slow_uploads)
    wait_for(
        lambda: any(r["attempt"] == 2 for r in completed_checkpoints(home, job)),
        300,
        "a checkpoint of attempt 2",
        proc,
    )
    kill_driver(proc)

    # 3rd attempt: restores and runs to the end.
    run_to_end(home, "run", job, "--idle-timeout", IDLE)
    assert {r["attempt"] for r in completed_checkpoints(home, job)} == {1, 2, 3}
    jobs = table_rows(home / "warehouse" / "catalog" / "streaming_jobs", ["attempt", "allocation"])
    assert all(json.loads(a) == {"0": HOST, "1": HOST} for _, a in jobs), jobs
    got = output(home, job)
    assert len(got) == len(reference)
    assert got == reference
    if job == "clicks_per_user":  # per-user totals equal the input: none lost, none twice
        latest = {}
        for user, clicks, _last_ts, _epoch in got:
            latest[user] = max(latest.get(user, 0), clicks)
        assert sum(latest.values()) == 2 * INPUTS[job][0][1]
    shutil.rmtree(home / "local-state", ignore_errors=True)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(reference, tmp_path):
    home = make_home(tmp_path, "home")
    proc = cutline(home, "run", JOB, "--idle-timeout", IDLE)
    wait_for(lambda: len(completed_checkpoints(home, JOB)) >= 3, 300, "3 checkpoints", proc)
    kill_driver(proc)
    latest = max(completed_checkpoints(home, JOB), key=lambda r: r["checkpoint_id"])
    manifest = CheckpointManifest.from_json(
        (home / "checkpoints" / latest["metadata_path"]).read_bytes()
    )
    older = {
        f.path
        for r in completed_checkpoints(home, JOB)
        if r["checkpoint_id"] < latest["checkpoint_id"]
        for f in CheckpointManifest.from_json(
            (home / "checkpoints" / r["metadata_path"]).read_bytes()
        ).files()
    }
    victim = next(f for f in manifest.files() if f.shared and f.path not in older)
    (home / "checkpoints" / JOB / victim.path).unlink()

    run_to_end(home, "run", JOB, "--idle-timeout", IDLE)
    rows = {r["checkpoint_id"]: r for r in completed_checkpoints(home, JOB)}
    assert rows[latest["checkpoint_id"]]["status"] == "CORRUPT"
    log = (home / "driver.log").read_text()
    assert f"checkpoint {latest['checkpoint_id']} is not restorable" in log
    assert f"restored checkpoint {latest['checkpoint_id'] - 1} " in log
    assert output(home) == reference


def test_at_least_once_loses_nothing_and_reports_duplicates(reference, tmp_path):
    home = make_home(tmp_path, "home")
    proc = cutline(home, "run", JOB, "--idle-timeout", IDLE, "--mode", "at_least_once")

    def output_ahead_of_checkpoints() -> bool:
        done = completed_checkpoints(home, JOB)
        epochs = [row[-1] for row in output(home)]
        return len(done) >= 2 and max(epochs, default=-1) > max(r["batch_id"] for r in done)

    wait_for(output_ahead_of_checkpoints, 300, "output not yet covered by a checkpoint", proc)
    kill_driver(proc)
    run_to_end(home, "run", JOB, "--idle-timeout", IDLE, "--mode", "at_least_once")
    got = output(home)
    missing = Counter(reference) - Counter(got)
    duplicates = Counter(got) - Counter(reference)
    print(f"at-least-once after one kill: {sum(duplicates.values())} duplicate rows")
    assert not missing, "at-least-once never loses output"
    assert set(got) == set(reference)
