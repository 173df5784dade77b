"""The crash tests' kill points (state/faults.py) themselves: where they fire and where not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from state import faults

SCRIPT = textwrap.dedent(
    """
    import pathlib, sys
    from state import faults
    faults.kill_point("batch-applied")
    print("reached once", flush=True)
    pathlib.Path(sys.argv[1]).touch()
    faults.kill_point("snapshot-taken")  # another point: never counts
    faults.kill_point("batch-applied")
    print("reached twice", flush=True)
    """
)


def test_a_kill_point_armed_by_a_file_counts_only_the_times_after_it_exists(tmp_path):
    gate, record = tmp_path / "armed", tmp_path / "faults.log"
    env = {
        **os.environ,
        faults.ENV: "batch-applied@1",
        faults.AFTER_ENV: str(gate),
        faults.RECORD_ENV: str(record),
    }
    env.pop(faults.GROUP_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(gate)],
        env=env,
        capture_output=True,
        text=True,
        start_new_session=True,  # the kill takes this process group, not the test's
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.splitlines() == ["reached once"]
    assert record.read_text() == "CUTLINE_FAULT killed at batch-applied\n"
