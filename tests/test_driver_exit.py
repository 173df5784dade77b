"""A driver that dies by a signal leaves words: the exit described with the signal named, and its
attempt's catalog row FAILED with that reason (orchestration/driver_exit.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestration.driver_exit import exit_description, record_driver_exit, signal_of
from spark_jobs.catalog.delta_catalog import DeltaCatalog

JOB = "clicks_per_user"


@pytest.mark.parametrize(
    "code, words",
    [
        (1, "exit code 1"),
        (2, "exit code 2"),
        (-11, "killed by signal 11 (SIGSEGV)"),
        (-9, "killed by signal 9 (SIGKILL)"),
        (139, "exit code 139: killed by signal 11 (SIGSEGV)"),  # spark-submit's report of it
        (134, "exit code 134: killed by signal 6 (SIGABRT)"),
        (128, "exit code 128"),
        (255, "exit code 255"),
    ],
)
def test_an_exit_is_described_with_the_signal_named(code, words):
    assert exit_description(code) == words


def test_a_real_segfault_reads_as_one():
    crash = "import ctypes; ctypes.string_at(0)"  # a read of address 0, as delta-rs's strlen did
    code = subprocess.run([sys.executable, "-c", crash], capture_output=True).returncode
    assert signal_of(code) == 11 and exit_description(code) == "killed by signal 11 (SIGSEGV)"


def test_the_attempt_a_dead_driver_left_running_is_failed_naming_the_signal(tmp_path):
    catalog = DeltaCatalog(tmp_path / "catalog")
    ended = catalog.begin_attempt(JOB, run_id="run-a")
    catalog.set_job_status(JOB, ended, "FINISHED")
    crashed = catalog.begin_attempt(JOB, run_id="run-b")
    other = catalog.begin_attempt("other_job", run_id="run-b")

    assert record_driver_exit(catalog, JOB, "run-a", 139) == []  # it recorded its own end
    assert record_driver_exit(catalog, JOB, "run-b", 139) == [crashed]
    rows = {r["attempt"]: r for r in catalog.jobs(JOB)}
    assert rows[ended]["status"] == "FINISHED"
    assert rows[crashed]["status"] == "FAILED"
    assert rows[crashed]["failure_reason"] == (
        "the driver process ended (exit code 139: killed by signal 11 (SIGSEGV)) without "
        "recording why"
    )
    assert catalog.jobs("other_job")[0]["attempt"] == other
    assert catalog.jobs("other_job")[0]["status"] == "RUNNING"  # another job's, untouched
