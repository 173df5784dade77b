"""A restore never re-emits committed output and never silently starts over.

- Falling back past a damaged checkpoint (a truncated file, found by validation; a same-size
  corruption of the primary copy, found by its checksum while restoring with the local copies
  gone) marks it CORRUPT and replays, without output, the epochs the sink had already committed.
- A wrong checkpoint root is a configuration error (exit 2) and marks nothing CORRUPT; with every
  checkpoint damaged the run fails (exit 2) every time it is started and never reads its input
  from the beginning; starting over is explicit (``--restore none``) and refuses to append to a
  sink with output unless told to reset it.

Output is compared with the answer computed from the input by pandas (tests/reference.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.driver.attempt_start import sink_writers
from spark_jobs.job_loader import get_job
from spark_jobs.sources.generate import generate
from state.manifest import CheckpointManifest
from tests.e2e_util import completed_checkpoints, cutline, finish, last_line, report, run_to_end
from tests.reference import check, output

pytestmark = [pytest.mark.slow, pytest.mark.spark]

JOB = "clicks_per_user"
RUN = ["--until-caught-up", "--interval-ms", "1000", "--max-records-per-partition", "4000"]
BAD = 2  # cutline's exit code for bad input or configuration


def more_input(home: Path, count: int = 8_000) -> None:
    generate(home / "log", "clicks", "clicks", count=count, seed=7, users=3_000)


def retained(home: Path) -> list[dict]:
    rows = [r for r in completed_checkpoints(home, JOB) if r["status"] == "COMPLETED"]
    return sorted(rows, key=lambda r: r["checkpoint_id"])


def damage_newest(home: Path, *, same_size: bool) -> tuple[CheckpointManifest, ...]:
    """Damage one shared file that the newest retained checkpoint alone references; returns
    that checkpoint and the one the restore must fall back to."""
    rows = retained(home)
    manifests = [
        CheckpointManifest.from_json((home / "checkpoints" / r["metadata_path"]).read_bytes())
        for r in rows
    ]
    newest, older = manifests[-1], {f.path for m in manifests[:-1] for f in m.files()}
    victim = next(f for f in newest.files() if f.shared and f.path not in older)
    path = home / "checkpoints" / JOB / victim.path
    data = path.read_bytes()
    if same_size:
        path.write_bytes(data[:64] + bytes(b ^ 0xFF for b in data[64:80]) + data[80:])
    else:
        path.write_bytes(data[: len(data) // 2])
    return newest, manifests[-2]


def committed_epoch(home: Path) -> int:
    """The last epoch the job's output sink committed, as the sink itself reads it."""
    return sink_writers(get_job(JOB), RuntimePaths.under(home), attempt=0)[0].committed_epoch()


def status(home: Path, checkpoint_id: int) -> str:
    rows = completed_checkpoints(home, JOB)
    return next(r["status"] for r in rows if r["checkpoint_id"] == checkpoint_id)


def replayed(log: str, restored: CheckpointManifest, committed: int) -> str:
    """The restore's replay line, which must cover exactly the epochs after the restored
    checkpoint's cut through the sinks' committed epoch."""
    lines = [line for line in log.splitlines() if line.startswith("replayed epochs")]
    assert lines, f"no replay after restoring checkpoint {restored.checkpoint_id}"
    assert lines[-1].startswith(f"replayed epochs {restored.batch_id + 1}..{committed} ("), (
        lines[-1],
        restored.batch_id,
        committed,
    )
    return lines[-1]


@pytest.mark.matrix("restore safety")
def test_falling_back_past_damaged_checkpoints_never_re_emits_committed_output(tmp_path):
    """A checkpoint at the first micro-batch, then none until the final one (a 60 s interval):
    the fallback past the damaged final checkpoint replays every epoch between them."""
    home = tmp_path / "home"
    more_input(home, 24_000)
    run = [*RUN, "--interval-ms", "60000"]
    run_to_end(home, "run", JOB, *run)
    for same_size in (False, True):
        committed = committed_epoch(home)
        damaged, fallback = damage_newest(home, same_size=same_size)
        assert committed - fallback.batch_id >= 3, "a fallback several epochs deep"
        if same_size:  # the primary copy is the only one left
            shutil.rmtree(home / "local-state")
        more_input(home, 16_000)  # the next round's fallback is as deep
        log_start = (home / "driver.log").stat().st_size
        run_to_end(home, "run", JOB, *run)
        log = (home / "driver.log").read_text()[log_start:]
        cid = damaged.checkpoint_id
        assert status(home, cid) == "CORRUPT"
        assert f"checkpoint {cid} is not restorable, marking it CORRUPT" in log
        after = log.split(f"checkpoint {cid} is not restorable")[-1].splitlines()
        assert ("does not match its checksum" if same_size else "size") in after[0]
        assert f"restored checkpoint {fallback.checkpoint_id} (batch" in log
        replay = replayed(log, fallback, committed)
        how = "same size" if same_size else "truncated"
        report(f"checkpoint {cid} damaged ({how}), {fallback.checkpoint_id} restored: {replay}")
        report(check("clicks_per_user", home))


@pytest.mark.matrix("restore safety")
def test_a_restore_of_an_older_checkpoint_by_id_replays_the_committed_epochs(tmp_path):
    """``--restore ID`` of a checkpoint several epochs behind the sink's committed epoch (kept,
    subsumed, since no GC ran): the committed epochs run again without output, then new input."""
    home = tmp_path / "home"
    more_input(home, 24_000)
    run_to_end(home, "run", JOB, *RUN)
    committed = committed_epoch(home)
    rows = sorted(completed_checkpoints(home, JOB), key=lambda r: r["checkpoint_id"])
    old = next(r for r in reversed(rows) if r["batch_id"] <= committed - 3)
    manifest = CheckpointManifest.from_json(
        (home / "checkpoints" / old["metadata_path"]).read_bytes()
    )
    more_input(home)
    log_start = (home / "driver.log").stat().st_size
    run_to_end(home, "run", JOB, *RUN, "--restore", str(old["checkpoint_id"]))
    log = (home / "driver.log").read_text()[log_start:]
    assert f"restored checkpoint {old['checkpoint_id']} (batch" in log
    report(
        f"--restore {old['checkpoint_id']} ({old['status']}): {replayed(log, manifest, committed)}"
    )
    report(check("clicks_per_user", home))


@pytest.mark.matrix("restore safety")
def test_a_restore_never_silently_starts_over(tmp_path):
    home = tmp_path / "home"
    more_input(home, 16_000)
    run_to_end(home, "run", JOB, *RUN)
    rows_before = len(output(home, JOB))

    # a wrong checkpoint root: a configuration error, nothing marked CORRUPT
    run_to_end(home, "run", JOB, *RUN, "--checkpoint-root", str(tmp_path / "elsewhere"), rc=BAD)
    assert "was written under the checkpoint root" in last_line(home)
    assert all(r["status"] != "CORRUPT" for r in completed_checkpoints(home, JOB))

    # an explicit start-over refuses to append to the output...
    run_to_end(home, "run", JOB, *RUN, "--restore", "none", rc=BAD)
    assert "--reset-sink" in last_line(home)

    # every retained checkpoint damaged: fails, and fails again, never reading from the start
    for row in retained(home):
        manifest = home / "checkpoints" / row["metadata_path"]
        manifest.write_bytes(manifest.read_bytes()[:-20])  # unreadable manifest: evidence
    for _ in range(2):
        proc = cutline(home, "run", JOB, *RUN)
        assert finish(proc) == BAD, last_line(home)
        assert "none can be restored" in last_line(home)
        assert "does not start over" in last_line(home)
    assert len(output(home, JOB)) == rows_before
    report(f"refused twice: {last_line(home)[:160]}...")

    # ...unless told to reset it: then the output is that of the whole input, once
    more_input(home)
    run_to_end(home, "run", JOB, *RUN, "--restore", "none", "--reset-sink")
    assert "start-over deletes" in (home / "driver.log").read_text()
    report(check("clicks_per_user", home))


@pytest.mark.landing  # no Spark starts: refused before
def test_bad_options_are_refused_not_ignored(tmp_path):
    for option in ("--interval-ms", "--parallelism", "--max-records-per-partition"):
        for value in ("0", "-3"):
            proc = cutline(tmp_path, "run", JOB, option, value)
            assert finish(proc, timeout=60) == BAD
            assert (
                f"argument {option}: must be > 0, got {value}"
                in (tmp_path / "driver.log").read_text()
            )
    assert finish(cutline(tmp_path, "run", JOB, "--reset-sink"), timeout=60) == BAD
    assert "--reset-sink only goes with --restore none" in last_line(tmp_path)
    assert finish(cutline(tmp_path, "run", JOB, "--takeovers", "1"), timeout=60) == BAD
    assert "--takeovers counts a supervisor's takeovers: it needs --standby" in last_line(tmp_path)
