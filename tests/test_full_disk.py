"""A full local disk is named, and loses nothing (issue 36, 2.6). The driver runs with its local
state on a small tmpfs of its own (a mount namespace: ``unshare --mount``) that a filler fills
once two checkpoints completed. The attempt fails with one line that says the disk is full,
which path, which host and which subtask, and the catalog's ``failure_reason`` says the same;
with space again (the local state root on the ordinary disk), the restore from the primary
copies reads on, and the output equals the reference computed from the input by pandas."""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path

import pytest

from spark_jobs.catalog.tables import read_delta
from spark_jobs.deploy.standalone import can_hide
from spark_jobs.sources.generate import generate
from tests.e2e_util import cutline, finish, last_line, report, run_to_end
from tests.reference import check

pytestmark = [pytest.mark.slow, pytest.mark.spark]

JOB = "clicks_per_user"
RUN = ["--interval-ms", "500", "--max-records-per-partition", "2000"]


def on_a_disk_that_fills(disk: Path, checkpoints: Path) -> callable:
    """A view (tests/e2e_util.py ``cutline``) running the driver with ``disk`` a 16 MiB tmpfs of
    its own, filled to the last byte once the job's second checkpoint has its manifest."""
    second = checkpoints / JOB / "chk-2" / "_metadata"
    script = (
        f"mount -t tmpfs -o size=16m cutline-full {shlex.quote(str(disk))} && "
        f"(until [ -e {shlex.quote(str(second))} ]; do sleep 0.1; done; "
        f"dd if=/dev/zero of={shlex.quote(str(disk / 'filler'))} bs=64k 2>/dev/null) & "
        'exec "$@"'
    )
    return lambda command: ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            script, "sh", *command]  # fmt: skip


def test_a_full_disk_is_named_with_path_host_and_subtask_and_the_restore_is_exact(tmp_path):
    if not can_hide():
        why = "no mount namespaces here (unshare --mount): a full disk cannot be made"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run this test (give it CAP_SYS_ADMIN)", pytrace=False)
        pytest.skip(why)
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=60_000, seed=7, users=20_000)
    disk = tmp_path / "disk"
    disk.mkdir()
    view = on_a_disk_that_fills(disk, home / "checkpoints")
    local = ["--local-state-root", str(disk / "local-state")]
    driver = cutline(home, "run", JOB, *RUN, *local, "--idle-timeout", "60", view=view)
    assert finish(driver, timeout=300) == 1, (home / "driver.log").read_text()[-4000:]
    line = last_line(home)
    report(line)
    assert line.startswith("cutline: ") and "disk full (no space left on device)" in line, line
    assert str(disk / "local-state" / JOB) in line and socket.gethostname() in line, line
    assert "stage 'count_by_user' subtask " in line, line
    [attempt] = read_delta(home / "warehouse" / "catalog" / "streaming_jobs", JOB).to_pylist()
    assert attempt["status"] == "FAILED" and attempt["failure_reason"] in line
    assert "disk full (no space left on device)" in attempt["failure_reason"]
    # space again: the local state root on the ordinary disk, restored from the primary copies
    run_to_end(home, "run", JOB, "--until-caught-up", *RUN)
    log = (home / "driver.log").read_text(errors="replace")
    assert "\nrestored checkpoint " in log, "the second attempt restored a checkpoint"
    report(check(JOB, home))
