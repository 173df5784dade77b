"""``make demo`` on its way out kills only drivers its runs started: a pid from a run's tags whose
process died and was reused by another process is left alone."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestration.demo import started_by

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_driver_counts_only_while_it_names_its_run_worker():
    worker = os.getpid()
    driver = subprocess.Popen(SLEEP, env={**os.environ, "CUTLINE_WATCH_PID": str(worker)})
    stranger = subprocess.Popen(SLEEP, env={**os.environ, "CUTLINE_WATCH_PID": str(worker + 1)})
    unrelated = {k: v for k, v in os.environ.items() if k != "CUTLINE_WATCH_PID"}
    bystander = subprocess.Popen(SLEEP, env=unrelated)
    try:
        assert started_by(driver.pid, worker)
        assert not started_by(stranger.pid, worker)  # another run's driver
        assert not started_by(bystander.pid, worker)  # a process that reused a driver's pid
    finally:
        for proc in (driver, stranger, bystander):
            proc.kill()
            proc.wait()
    assert not started_by(driver.pid, worker)  # gone
