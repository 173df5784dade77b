"""Fencing, shown with the faults a skeptic makes: two attempts started within a second, a zombie
attempt that keeps running beside its successor while input keeps arriving, a driver paused with
SIGSTOP and resumed after a new attempt committed, and an orphan manifest left by a driver killed
between ``_metadata`` and its catalog commit. Each ends with the output compared with the answer
computed from the input by pandas (tests/reference.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from spark_jobs.catalog.tables import read_delta
from spark_jobs.sources.generate import generate
from state.faults import ENV as KILL_ENV
from tests.e2e_util import (
    ROOT,
    checkpoints_so_far,
    committed_after_fence,
    completed_checkpoints,
    cutline,
    finish,
    kill_driver,
    last_line,
    report,
    run_to_end,
    wait_for,
)
from tests.reference import check

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.matrix("fencing")]

JOB = "clicks_per_user"
RUN = ["--idle-timeout", "4", "--interval-ms", "1000", "--max-records-per-partition", "4000"]
SUPERSEDED = 3  # cutline's exit code for an attempt a newer one replaced
SINKS = {"clicks_out": "clicks_per_user"}


def attempts(home) -> list[dict]:
    path = home / "warehouse" / "catalog" / "streaming_jobs"
    return sorted(read_delta(path, JOB).to_pylist(), key=lambda r: r["attempt"])


def feed(home, count: int, rate: float) -> subprocess.Popen:
    """Append ``count`` clicks in all (2 partitions) at ``rate`` records/s, in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), "generate", "clicks",
         "--count", str(count), "--rate", str(rate), "--users", "3000", "--seed", "7"],
        cwd=ROOT,
    )  # fmt: skip


def late_commits(home, old: int, new: int) -> list:
    """What attempt ``old`` committed after attempt ``new`` fenced it (Delta commit order)."""
    return committed_after_fence(home, JOB, SINKS, old, new)


@pytest.mark.parametrize("earlier", [False, True], ids=["fresh home", "after earlier attempts"])
def test_two_attempts_started_together_never_share_a_number(earlier, tmp_path):
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=20_000, seed=7, users=3_000)
    if earlier:
        run_to_end(home, "run", JOB, *RUN)
        generate(home / "log", "clicks", "clicks", count=20_000, seed=7, users=3_000)
    first = cutline(home, "run", JOB, *RUN, log=home / "first.log")
    time.sleep(0.3)
    second = cutline(home, "run", JOB, *RUN, log=home / "second.log")
    codes = sorted([finish(first), finish(second)])
    rows = attempts(home)
    numbers = [r["attempt"] for r in rows]
    report(f"attempts {[(r['attempt'], r['status']) for r in rows]}, exit codes {codes}")
    assert len(numbers) == len(set(numbers)), f"two starters shared an attempt number: {numbers}"
    assert codes == [0, SUPERSEDED], "the older attempt stops as superseded, the newer runs"
    run_to_end(home, "run", JOB, *RUN)
    report(check("clicks_per_user", home))


def test_a_zombie_attempt_commits_nothing_once_a_newer_one_started(tmp_path):
    """The older attempt keeps running (slow uploads keep its checkpoints pending) while input
    arrives and a second attempt starts; it is never killed."""
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=8_000, seed=7, users=3_000)
    generator = feed(home, 60_000, 2_000.0)
    zombie = cutline(
        home, "run", JOB, *RUN, env={"CUTLINE_FAULT_UPLOAD_DELAY_S": "4"}, log=home / "zombie.log"
    )
    try:
        wait_for(lambda: checkpoints_so_far(home, JOB), 300, "a checkpoint", zombie)
        time.sleep(3)  # more micro-batches staged, checkpoints pending
        successor = cutline(home, "run", JOB, *RUN, log=home / "successor.log")
        assert finish(zombie) == SUPERSEDED, last_line(home, "zombie.log")
        assert generator.wait(timeout=300) == 0
        assert finish(successor) == 0, last_line(home, "successor.log")
    finally:
        for proc in (generator, zombie):
            if proc.poll() is None:
                kill_driver(proc) if proc is zombie else proc.kill()
    old, new = attempts(home)[:2]
    before = [r for r in completed_checkpoints(home, JOB) if r["attempt"] == old["attempt"]]
    assert before, "the zombie completed checkpoints before it was fenced"
    assert late_commits(home, old["attempt"], new["attempt"]) == []
    report(f"zombie: {last_line(home, 'zombie.log')}")
    run_to_end(home, "run", JOB, *RUN)
    report(check("clicks_per_user", home))


def test_a_paused_driver_resumed_after_a_new_attempt_committed_commits_nothing(tmp_path):
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=12_000, seed=7, users=3_000)
    paused = cutline(home, "run", JOB, *RUN, log=home / "paused.log")
    try:
        wait_for(lambda: checkpoints_so_far(home, JOB), 300, "a checkpoint", paused)
        os.killpg(paused.pid, signal.SIGSTOP)  # the driver, its JVM and its workers
        generate(home / "log", "clicks", "clicks", count=12_000, seed=7, users=3_000)
        successor = cutline(home, "run", JOB, *RUN, log=home / "successor.log")
        wait_for(
            lambda: any(r["attempt"] == 2 for r in completed_checkpoints(home, JOB)),
            300,
            "a checkpoint of the new attempt",
            successor,
        )
        os.killpg(paused.pid, signal.SIGCONT)
        assert finish(paused) == SUPERSEDED, last_line(home, "paused.log")
        assert finish(successor) == 0, last_line(home, "successor.log")
    finally:
        if paused.poll() is None:
            os.killpg(paused.pid, signal.SIGCONT)
            kill_driver(paused)
    assert late_commits(home, 1, 2) == []
    report(f"resumed driver: {last_line(home, 'paused.log')}")
    run_to_end(home, "run", JOB, *RUN)
    report(check("clicks_per_user", home))


def test_an_orphan_manifest_never_stalls_the_job_and_gc_removes_it(tmp_path):
    """A driver killed after it wrote chk-n/_metadata but before its catalog commit: later
    attempts skip the orphan's id, their final checkpoint completes, and GC deletes the orphan."""
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=20_000, seed=7, users=3_000)
    killed = cutline(home, "run", JOB, *RUN, env={KILL_ENV: "metadata-written@2"})
    assert finish(killed) == -signal.SIGKILL
    committed = {r["checkpoint_id"] for r in completed_checkpoints(home, JOB)}
    root = home / "checkpoints" / JOB
    orphans = sorted(
        int(p.parent.name[4:]) for p in root.glob("chk-*/_metadata")
    )  # fmt: skip
    orphans = [cid for cid in orphans if cid not in committed]
    assert orphans, "the kill left an orphan manifest"
    for _ in range(2):  # two attempts, each to the end of its input and its final checkpoint
        generate(home / "log", "clicks", "clicks", count=8_000, seed=7, users=3_000)
        run_to_end(home, "run", JOB, *RUN)
    ids = sorted(r["checkpoint_id"] for r in completed_checkpoints(home, JOB))
    assert not set(orphans) & set(ids) and max(ids) > max(orphans)
    run_to_end(home, "gc", JOB, "--grace-s", "0")
    assert not [cid for cid in orphans if (root / f"chk-{cid}" / "_metadata").exists()]
    report(f"orphan manifests {orphans} skipped and collected; checkpoints {ids}")
    report(check("clicks_per_user", home))
