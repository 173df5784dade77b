"""The README's first job, copied as a user would copy it into a package of their own: its
harness test passes, and on real Spark the job's Delta output is exactly the running counts the
input gives, epoch by epoch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.sources.generate import generate
from tests.e2e_util import ROOT, completed_checkpoints, report, run_to_end
from tests.epoch_cuts import EPOCH
from tests.reference import before_cut, job_cuts, output, read_log
from tests.row_check import compare_rows

BLOCK = re.compile(r"<!-- readme-job: (\S+) -->\n```python\n(.*?)```", re.S)


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A scratch directory holding the README's files (``my_counts/jobs.py``, its test)."""
    files = BLOCK.findall((ROOT / "README.md").read_text())
    assert {name for name, _ in files} == {"my_counts/jobs.py", "test_counts.py"}, files
    for name, code in files:
        path = tmp_path / "scratch" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    (tmp_path / "scratch" / "my_counts" / "__init__.py").write_text("")
    return tmp_path / "scratch"


def test_the_readme_test_of_the_first_job_passes(package):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_counts.py"],
        cwd=package,
        env={**os.environ, "PYTHONPATH": f"{package}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


@pytest.mark.slow
@pytest.mark.landing
@pytest.mark.spark
def test_the_readme_job_runs_and_its_output_is_exact(package, tmp_path):
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=5_000, seed=3, users=500)
    env = {"PYTHONPATH": f"{package}{os.pathsep}{ROOT}"}
    run_to_end(home, "run", "my_counts.jobs:counts", "--until-caught-up", env=env)
    cuts = job_cuts(home, ["counts"])
    clicks = cuts.assign(read_log(home, "clicks"), "clicks")
    per = clicks.groupby(["user", EPOCH]).size().rename("n").reset_index()
    per = per.sort_values(["user", EPOCH])
    per["n"] = per.groupby("user")["n"].cumsum()
    report(compare_rows(output(home, "counts"), per, ["user"], ["n"], "counts"))
    # the README's state read: each user's n in the latest checkpoint, the clicks before its cut
    latest = max(completed_checkpoints(home, "counts"), key=lambda r: r["checkpoint_id"])
    cut = json.loads(latest["source_positions"])["clicks"]
    log = read_log(home, "clicks")
    before = before_cut(log, cut)
    final = before.groupby("user").size().rename("n").reset_index().assign(**{EPOCH: 0})
    table = home / "n"
    flags = ["--stage", "count", "--state", "n", "--out", str(table)]
    run_to_end(home, "state", "read", "my_counts.jobs:counts", *flags, env=env)
    state = output(home, "n", root=str(home)).rename(columns={"value": "n"}).assign(**{EPOCH: 0})
    report(compare_rows(state, final, ["user"], ["n"], "state n"))
