"""``make demo`` (``python -m orchestration.demo``) stops everything it started when it gets
SIGTERM or SIGHUP (a closed terminal), as it does on Ctrl-C: the webserver, the daemon, the
generator, the streaming run and its Spark driver."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e_util import ROOT, report, wait_for
from tests.test_dagster_e2e import free_port

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.matrix("demo signals")]


def processes_of(home: Path) -> dict[int, str]:
    """Live processes whose command line or environment names ``home`` (pid -> command)."""
    mark = str(home).encode()
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours
            continue
        if state != "Z" and (mark in cmdline or mark in environ):
            found[int(proc.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")[:120]
    return found


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_the_demo_stops_everything_it_started(signum, tmp_path):
    home = tmp_path / "home"
    out = tmp_path / "demo.log"
    with open(out, "wb") as log:
        demo = subprocess.Popen(
            [sys.executable, "-m", "orchestration.demo", "--home", str(home),
             "--port", str(free_port()), "--rate", "500"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: "kill -9" in out.read_text(), 300, "the driver's pid", demo)
        pid = int(re.search(r"kill -9 (\d+)", out.read_text()).group(1))
        started = processes_of(home)
        assert pid in started, "the kill instruction names the running driver"
        assert len(started) >= 4, started  # webserver, daemon, generator, driver, ...
        os.kill(demo.pid, signum)
        assert demo.wait(timeout=120) == 0, out.read_text()[-3000:]
        deadline = time.monotonic() + 30
        while processes_of(home) and time.monotonic() < deadline:
            time.sleep(1)
        left = processes_of(home)
        report(f"{signal.Signals(signum).name}: {len(started)} processes stopped, {len(left)} left")
        assert not left, f"left running after {signal.Signals(signum).name}: {left}"
    finally:
        for pid in processes_of(home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
