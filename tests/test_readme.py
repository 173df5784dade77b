"""The README's first job, copied as a user would copy it into a package of their own: its
harness test passes, and the README's shell lines, run as written in a shell from the fresh
scratch directory (only the activation's path is this clone's), run it on real Spark; its Delta
output is exactly the running counts the input gives, epoch by epoch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e_util import ROOT, completed_checkpoints, report, run_to_end
from tests.epoch_cuts import EPOCH
from tests.reference import before_cut, job_cuts, output, read_log
from tests.row_check import compare_rows

BLOCK = re.compile(r"<!-- readme-job: (\S+) -->\n```python\n(.*?)```", re.S)
# the shell lines that run the first job: the README's first sh block after the job's test
SHELL = re.compile(r"<!-- readme-job: test_counts.py -->.*?```sh\n(.*?)```", re.S)
ACTIVATE = "path/to/cutline/.venv"  # the one thing a reader fills in


def readme_shell_lines() -> list[str]:
    """The README's lines for the first job, with this environment's path to activate."""
    block = SHELL.search((ROOT / "README.md").read_text())
    assert block, "the README runs its first job in an sh block after the job's test"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert ACTIVATE in lines[0], lines[0]
    return [line.replace(ACTIVATE, sys.prefix) for line in lines]


def as_a_reader(env: dict[str, str]) -> dict[str, str]:
    """The environment of a shell the README's reader opened: nothing of the suite's own but
    the quick compiler of short-lived test JVMs (tests/conftest.py)."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"}
    return {k: v for k, v in env.items() if k not in drop and not k.startswith("CUTLINE_")}


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
    env = as_a_reader(dict(os.environ))
    # the lines in one shell, as a reader pastes them: the activation holds for the rest
    script = "set -e\n" + "\n".join(readme_shell_lines()) + "\n"
    done = subprocess.run(
        ["bash", "-c", script], cwd=package, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, (
        f"the README's lines failed:\n{done.stdout[-4000:]}{done.stderr[-6000:]}"
    )
    assert " COMPLETED " in done.stdout, done.stdout[-4000:]  # cutline checkpoints listed them
    home = package / ".cutline"  # where the README says the output is
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
    env = {"PYTHONPATH": f"{package}{os.pathsep}{ROOT}"}
    run_to_end(home, "state", "read", "my_counts.jobs:counts", *flags, env=env)
    state = output(home, "n", root=str(home)).rename(columns={"value": "n"}).assign(**{EPOCH: 0})
    report(compare_rows(state, final, ["user"], ["n"], "state n"))
