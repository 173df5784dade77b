"""A driver's start never writes the environment beside another thread (issue 36: a ``setenv``
beside delta-rs's native reads on the start plan's thread crashed a driver in libc). The real
start path, run many times in one process with the window widened (tests/start_race.py): every
write to the environment is watched, and none may happen while the plan thread exists. The
same harness in the order before the fix is caught at once, so the watch itself is shown to
work. (The crash itself: ``read_delta`` and commits on one thread beside new keys written on
the main one segfaults within seconds; docs/operations.md.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spark_jobs.deploy.python_env import PYTHON_VARIABLES
from tests import tiers

ROOT = Path(__file__).resolve().parent.parent
STARTS = 20 if tiers.landing() else 200


def starts(home: Path, n: int, order: str) -> tuple[int, int]:
    """``n`` starts in ``order``: (starts through, environment writes beside other threads)."""
    env = {k: v for k, v in os.environ.items() if k not in PYTHON_VARIABLES}
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "start_race.py"), str(n), str(home), order],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-3000:]}"
    _, through, _, beside = out.stdout.split()
    return int(through), int(beside)


def test_the_start_path_writes_no_environment_beside_its_plan_thread(tmp_path):
    assert starts(tmp_path / "home", STARTS, "fixed") == (STARTS, 0)


def test_the_order_before_the_fix_is_caught_writing_beside_the_plan_thread(tmp_path):
    through, beside = starts(tmp_path / "home", 2, "old")
    assert through == 2 and beside > 0
