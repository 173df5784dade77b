"""A killed driver's query scratch directory is removed by the next start of its job
(spark_jobs/driver/scratch.py; issue 37: killed runs left them in the temp directory)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from spark_jobs.driver.scratch import query_scratch


def test_a_start_removes_the_scratch_of_drivers_gone_and_keeps_the_living(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    dead = tmp_path / f"cutline-sessions-query-{gone}-abc"
    living = tmp_path / f"cutline-sessions-query-{os.getppid()}-def"
    other_job = tmp_path / f"cutline-windowed_revenue-query-{gone}-ghi"
    for d in (dead, living, other_job):
        (d / "offsets").mkdir(parents=True)
    made = query_scratch("sessions")
    assert os.path.basename(made).startswith(f"cutline-sessions-query-{os.getpid()}-")
    assert not dead.exists() and living.exists() and other_job.exists()
