"""A standby driver takes over when the active one dies (spark_jobs/driver/standby.py).

The supervisor's decisions are shown with stand-in drivers (a few lines of Python each, no
Spark): who takes over on which exit, when the next standby starts, what ends the run. The
takeover itself is shown end to end: ``cutline run --standby`` with the active driver killed
with SIGKILL (its process group: its JVM too) at moments drawn from the printed seed; the run
must end by itself, exit 0, with the output equal to the pandas reference and one attempt per
takeover in the catalog.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from spark_jobs.catalog.tables import CatalogReader
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.driver.standby import (
    Order,
    Supervisor,
    await_order,
    driver_command,
    stand_by,
    takes_over,
)
from spark_jobs.errors import ConfigurationError
from spark_jobs.events import EventChannel
from spark_jobs.sources.generate import generate
from state import faults
from tests import tiers
from tests.e2e_util import cutline, finish, report
from tests.reference import check

JOB = "clicks_per_user"

# A stand-in driver: the active one (no --as-standby) exits with the code its run number gives
# (STANDIN_EXITS, one per driver in order of start); a standby waits for its order and, told to
# take over, emits "startup" (its first micro-batch) and becomes the next active one.
STANDIN = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    runs = Path(os.environ["STANDIN_DIR"])
    role = "standby" if "--as-standby" in sys.argv else "active"
    faults = [os.environ.get(v, "-") for v in ("CUTLINE_FAULT_KILL", "CUTLINE_FAULT_KILL_GROUP")]
    (runs / f"env-{os.getpid()}").write_text(" ".join([role, *faults]))
    def event(kind, **payload):
        print("CUTLINE_EVENT " + json.dumps({"kind": kind, **payload}), flush=True)
    if "--as-standby" in sys.argv:
        (runs / f"standby-{os.getpid()}").write_text("")
        if os.environ.get("STANDIN_STANDBY_DIES"):
            sys.exit(1)
        if os.environ.get("STANDIN_FIRST_STANDBY_DIES") and len(list(runs.glob("standby-*"))) == 1:
            os.kill(os.getpid(), 9)  # killed while it waits
        order = sys.stdin.readline().strip()
        if order != "take-over":
            (runs / f"stopped-{os.getpid()}").write_text(order or "eof")
            sys.exit(0)
    number = len(list(runs.glob("active-*")))
    (runs / f"active-{os.getpid()}").write_text(str(number))
    event("startup", attempt=number + 1)
    time.sleep(float(os.environ.get("STANDIN_RUN_S", "0.5")))
    exits = [int(c) for c in os.environ["STANDIN_EXITS"].split(",")]
    code = exits[min(number, len(exits) - 1)]
    if code < 0:
        os.kill(os.getpid(), -code)
    sys.exit(code)
    """
)


class Recorder(EventChannel):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, dict]] = []
        self.lines: list[str] = []

    def emit(self, kind: str, payload: dict) -> None:
        self.events.append((kind, payload))

    def log(self, message: str) -> None:
        self.lines.append(message)


def supervise(
    tmp_path: Path, exits: str, monkeypatch, takeovers: int = 10, standby_retry_s: float = 5.0
) -> tuple[int, Recorder]:
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    monkeypatch.setenv("STANDIN_DIR", str(runs))
    monkeypatch.setenv("STANDIN_EXITS", exits)
    events = Recorder()
    command = [sys.executable, str(script)]
    code = Supervisor(command, events, takeovers=takeovers, standby_retry_s=standby_retry_s).run()
    return code, events


def names(tmp_path: Path, prefix: str) -> list[Path]:
    return sorted((tmp_path / "runs").glob(f"{prefix}-*"))


def test_which_exits_are_taken_over() -> None:
    assert takes_over(1) and takes_over(-9) and takes_over(-11)
    assert not any(takes_over(code) for code in (0, 2, 3, 130))


def test_the_order_is_read_and_the_supervisors_end_means_stop() -> None:
    assert await_order(io.StringIO("\ntake-over\n")) is Order.TAKE_OVER
    assert await_order(io.StringIO("stop\n")) is Order.STOP
    assert await_order(io.StringIO("")) is Order.STOP  # the supervisor is gone
    with pytest.raises(ValueError):
        await_order(io.StringIO("go\n"))


def test_the_drivers_run_this_command_without_standby_and_never_under_spark_submit(monkeypatch):
    command = driver_command(
        ["--home", "h", "run", "job", "--standby", "--takeovers", "2", "--until-caught-up"]
    )
    assert command[3:] == ["--home", "h", "run", "job", "--until-caught-up"]
    assert driver_command(["run", "job", "--takeovers=1", "--standby"])[3:] == ["run", "job"]
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "4321")  # what spark-submit gives its driver
    with pytest.raises(ConfigurationError, match="not through spark-submit"):
        driver_command(["run", "job", "--standby"])


def test_a_standby_keeps_its_workers_warm_until_its_order() -> None:
    read, write = os.pipe()
    warmed = []

    def rewarm() -> None:
        warmed.append(time.monotonic())
        if len(warmed) == 3:
            os.write(write, b"take-over\n")

    with os.fdopen(read) as stream:
        assert stand_by(lambda _: None, rewarm, stream, every_s=0.05)
    assert len(warmed) == 3
    os.close(write)


def test_failed_and_killed_drivers_are_taken_over_until_one_finishes(tmp_path, monkeypatch):
    code, events = supervise(tmp_path, "1,-9,0", monkeypatch)
    assert code == 0
    takeovers = [p for k, p in events.events if k == "takeover"]
    assert [t["exit"] for t in takeovers] == [1, -9]
    assert len(names(tmp_path, "active")) == 3  # the first driver and two standbys
    # each standby after the first was launched once its predecessor's attempt had started,
    # and the one left over at the end was stopped, not left running
    assert len(names(tmp_path, "standby")) == 3
    assert [p.read_text() for p in names(tmp_path, "stopped")] == ["stop"]
    drivers = [p for k, p in events.events if k == "drivers"]
    assert drivers[0]["standby"] is None  # launched after the active one's first micro-batch
    assert drivers[1]["standby"] is not None and drivers[-1]["active"] == takeovers[-1]["to"]


def test_a_standby_that_dies_while_it_waits_is_replaced(tmp_path, monkeypatch):
    """The first standby is killed while it waits: the supervisor launches another after its
    pause, and that one takes over when the active driver fails."""
    monkeypatch.setenv("STANDIN_FIRST_STANDBY_DIES", "1")
    monkeypatch.setenv("STANDIN_RUN_S", "2")
    code, events = supervise(tmp_path, "1,0", monkeypatch, standby_retry_s=0.2)
    assert code == 0
    assert [t["exit"] for k, t in events.events if k == "takeover"] == [1]
    assert any("exited -9 while it waited; a new one in 0 s" in x for x in events.lines)
    # the one killed, its replacement (which took over), and the next one (stopped at the end)
    assert len(names(tmp_path, "standby")) == 3
    drivers = [p["standby"] for k, p in events.events if k == "drivers"]
    assert None in drivers[1:-1], "the dead standby was announced gone before its replacement"


def test_a_paused_driver_is_not_taken_over(tmp_path, monkeypatch):
    """A driver stopped (SIGSTOP) for longer than any heartbeat, as a long GC pause or a stalled
    micro-batch would hold it, is not dead: no takeover, and the run ends as it does."""
    monkeypatch.setenv("STANDIN_RUN_S", "1")
    paused = []

    def pause() -> None:
        deadline = time.monotonic() + 30
        while not names(tmp_path, "active") and time.monotonic() < deadline:
            time.sleep(0.02)
        pid = int(names(tmp_path, "active")[0].name.split("-")[1])
        os.kill(pid, signal.SIGSTOP)
        time.sleep(3.0)
        os.kill(pid, signal.SIGCONT)
        paused.append(pid)

    (tmp_path / "runs").mkdir()
    pauser = threading.Thread(target=pause)
    pauser.start()
    code, events = supervise(tmp_path, "0", monkeypatch)
    pauser.join()
    assert paused and code == 0
    assert not [k for k, _ in events.events if k == "takeover"]


def test_a_kill_point_is_the_first_drivers_and_kills_its_own_process_group(tmp_path, monkeypatch):
    """A test's kill point (state/faults.py) reaches the first driver only, and no driver
    inherits the supervisor's process group as the one its kill takes."""
    monkeypatch.setenv(faults.ENV, "batch-applied@2")
    monkeypatch.setenv(faults.GROUP_ENV, str(os.getpgid(0)))
    code, _ = supervise(tmp_path, "1,0", monkeypatch)
    assert code == 0
    seen = {p.read_text() for p in names(tmp_path, "env")}
    assert seen == {"active batch-applied@2 -", "standby - -"}


@pytest.mark.parametrize("exit_code", [2, 3])
def test_a_refused_or_superseded_driver_ends_the_run_and_its_standby(
    tmp_path, monkeypatch, exit_code
):
    code, events = supervise(tmp_path, str(exit_code), monkeypatch)
    assert code == exit_code
    assert not [k for k, _ in events.events if k == "takeover"]
    assert [p.read_text() for p in names(tmp_path, "stopped")] == ["stop"]


def test_after_its_takeovers_the_supervisor_leaves_the_restore_to_its_orchestrator(
    tmp_path, monkeypatch
):
    code, events = supervise(tmp_path, "-9", monkeypatch, takeovers=2)
    assert code == 1  # killed: what an orchestrator restores
    assert len([k for k, _ in events.events if k == "takeover"]) == 2
    assert len(names(tmp_path, "active")) == 3
    # no standby after the last takeover: it could never take over
    assert len(names(tmp_path, "standby")) == 2
    assert [p["standby"] for k, p in events.events if k == "drivers"][-1] is None


def test_without_a_live_standby_the_supervisor_leaves_the_restore_to_its_orchestrator(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("STANDIN_STANDBY_DIES", "1")
    code, events = supervise(tmp_path, "1", monkeypatch)
    assert code == 1
    assert not [k for k, _ in events.events if k == "takeover"]
    assert any("the standby is gone" in line for line in events.lines)


# -- end to end ------------------------------------------------------------------------------

# the run ends IDLE_S after its input stops: a driver catches up with the feeder between two of
# its appends (micro-batches run about twice a second), so `--until-caught-up` would end a run
# while the kills go on
IDLE_S = 5
RUN = ["--idle-timeout", str(IDLE_S), "--interval-ms", "1000"]
RUN += ["--max-records-per-partition", "1500"]


def drivers_event(log: Path) -> list[dict]:
    """The supervisor's "drivers" and "takeover" events and the drivers' "startup" ones, in
    order, from the run's log."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        match = re.match(r"CUTLINE_EVENT (.*)", line)
        if match:
            event = json.loads(match.group(1))
            if event["kind"] in ("drivers", "takeover", "startup", "batch"):
                out.append(event)
    return out


def active_after(log: Path, number: int, proc: subprocess.Popen, timeout: float = 240) -> int:
    """The active driver's pid once it is the ``number``-th to have run a micro-batch and a
    standby is warm beside it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        events = drivers_event(log)
        active = [e["active"] for e in events if e["kind"] == "drivers"][-1:]
        ran = len([e for e in events if e["kind"] == "startup"])
        if ran >= number and text.count("warm, waiting") >= number and active:
            return active[0]
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before a kill"
        time.sleep(0.2)
    raise AssertionError(f"no {number}th driver ran a micro-batch beside a standby in {timeout} s")


def feeding(home: Path, stop: threading.Event) -> threading.Thread:
    """A thread appending 750 clicks per partition every 0.5 s on the wall clock until
    ``stop``: a running driver is never ``IDLE_S`` without input while the kills go on."""

    def feed() -> None:
        began = time.monotonic()
        for n in itertools.count(1):
            if stop.wait(max(0.0, began + n * 0.5 - time.monotonic())):
                return
            generate(home / "log", "clicks", "clicks", count=750, seed=7, users=3_000)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
@pytest.mark.landing
@pytest.mark.spark
def test_the_standby_takes_over_from_killed_drivers_exactly_once(tmp_path):
    seed, rng = tiers.SEED, tiers.rng("standby kills")
    home = tmp_path / "home"
    kills = 2 if tiers.landing() else 5
    # a backlog, and input arriving until the last kill: the driver killed is never one that
    # already ended
    generate(home / "log", "clicks", "clicks", count=20_000, seed=7, users=3_000)
    stop = threading.Event()
    feeder = feeding(home, stop)
    env = {"CUTLINE_EVENTS": "stdout"}
    proc = cutline(home, "run", JOB, "--standby", *RUN, env=env)
    log = home / "driver.log"
    try:
        for number in range(1, kills + 1):
            pid = active_after(log, number, proc)
            time.sleep(rng.uniform(0.0, 3.0))
            os.killpg(pid, signal.SIGKILL)
            report(f"seed {seed}: kill -9 of active driver {pid} (its JVM too), kill {number}")
        stop.set()
        feeder.join()
        code = finish(proc, timeout=600)
    except BaseException:
        print(log.read_text(errors="replace")[-8000:] if log.exists() else "no log")
        raise
    finally:
        stop.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert code == 0, text[-6000:]
    events = drivers_event(log)
    takeovers = [e for e in events if e["kind"] == "takeover"]
    assert len(takeovers) == kills and all(t["exit"] == -9 for t in takeovers)
    # each takeover: from the old driver's death to the new one's first micro-batch
    startups = [e for e in events if e["kind"] == "startup"][1:]
    for startup in startups:
        seconds = sum(v for k, v in startup.items() if k != "kind" and not k.startswith("("))
        report(f"takeover, from the order to the first micro-batch: {seconds:.1f} s ({startup})")
    report(check(JOB, home))
    attempts = CatalogReader(RuntimePaths.under(home).catalog).jobs(JOB)
    assert [a["attempt"] for a in attempts] == list(range(1, kills + 2))
    assert attempts[-1]["status"] == "FINISHED"
    assert all(a["status"] != "RUNNING" for a in attempts)
