"""A standby driver: a second driver of the same job, its JVM, Spark session and Python workers
started and idle, that takes over when the active driver dies (docs/design.md, section 14).

Who decides. ``cutline run JOB --standby`` is a supervisor without a JVM of its own: it launches
the active driver and the standby as its children and waits on the active one. A process's exit
is the one sign of death that a slow micro-batch or a long GC pause never gives, so there is no
false takeover to guard against. When the active driver exits as a failed attempt (exit 1, or
killed by a signal: what an orchestrator would restore), the supervisor orders the standby to
take over. A standby is launched once the active driver has run its first micro-batch, so that
two JVMs never start side by side on the same cores; one that dies while it waits is replaced.
When the active driver exits 0, 2 or 3 (finished, refused, superseded) the standby is stopped and
the supervisor exits with that code.
A supervisor makes at most ``--takeovers`` takeovers (10); after the last it launches no standby,
and the next death ends the run as a failed attempt, for its orchestrator to restore.
A takeover begins a new attempt, which fences every older one (section 3): a driver that only
looked dead is stopped at its next commit, so a takeover never needs the old driver's help.

The standby reads its order on stdin (:class:`Order`, one line); the end of stdin without one
means the supervisor is gone, and the standby stops. The children's output comes back through
the supervisor: their log lines and events are the supervisor's (under Dagster Pipes too: the
children do not open a Pipes session of their own).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import IO

from spark_jobs.errors import EXIT_FAILED, ConfigurationError
from spark_jobs.events import EVENT_LINE, EventChannel
from state import faults
from state.processes import alive

STANDBY_FLAG = "--as-standby"  # the hidden `cutline run` option of a supervisor's standby child
TAKEOVERS_FLAG = "--takeovers"  # `cutline run --standby`'s, the supervisor's alone
TAKEOVERS = 10  # takeovers one supervisor makes; after them, its orchestrator restores the job
WATCH_S = 0.5  # how often the supervisor looks at its own orchestrator's process
REWARM_S = 45.0  # a standby's Python workers are used again before Spark's idle minute ends
STANDBY_RETRY_S = 5.0  # a standby that died waiting is replaced after this, doubled per death
STANDBY_RETRY_MAX_S = 300.0  # in a row (one that dies at once is not relaunched in a loop)
STOP_GRACE_S = 30.0  # a driver told to stop that has not ended by then is killed
_PIPES_ENV = ("DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES")
_GATEWAY_ENV = "PYSPARK_GATEWAY_PORT"  # set for a Python driver that spark-submit launched


class Order(str, Enum):
    """What the supervisor tells its standby, one line on the standby's stdin."""

    TAKE_OVER = "take-over"
    STOP = "stop"


def takes_over(code: int) -> bool:
    """Whether an active driver that exited with ``code`` is replaced by its standby: a failed
    attempt (1) or a driver killed by a signal (Popen's negative code). Not one that finished
    (0), was refused (2), was superseded (3) or was interrupted (130)."""
    return code == EXIT_FAILED or code < 0


def await_order(stream: IO[str]) -> Order:
    """The supervisor's order, read from ``stream`` (blocks until there is one); the end of the
    stream, the supervisor gone, is :attr:`Order.STOP`."""
    for line in stream:
        if line.strip():
            return Order(line.strip())
    return Order.STOP


def _event(line: str) -> dict | None:
    """The event a driver's output line carries (``CUTLINE_EVENTS=stdout``), or None."""
    if not line.startswith(EVENT_LINE):
        return None
    try:
        event = json.loads(line[len(EVENT_LINE) :])
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("kind"), str) else None


class Driver:
    """One child driver: its process (a process group of its own, so a kill of the group takes
    its JVM too) and a thread relaying its output to the supervisor's channel."""

    def __init__(self, command: list[str], standby: bool, events: EventChannel) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _PIPES_ENV}
        env = faults.for_driver(env, armed=not standby)  # a test's kill point: the first driver's
        env.update(CUTLINE_WATCH_PID=str(os.getpid()), CUTLINE_EVENTS="stdout")
        self.running = threading.Event()  # its attempt ran its first micro-batch ("startup")
        self.process = subprocess.Popen(
            command + ([STANDBY_FLAG] if standby else []),
            stdin=subprocess.PIPE if standby else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
            start_new_session=True,
        )
        self.pid = self.process.pid
        self._relay = threading.Thread(
            target=self._relay_output, args=(events,), name=f"cutline-relay-{self.pid}"
        )
        self._relay.start()

    def _relay_output(self, events: EventChannel) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:  # read to its end, or the driver blocks writing
            event = _event(line)
            if event is None:
                events.log(line.rstrip("\n"))
                continue
            kind = event.pop("kind")
            if kind == "startup":
                self.running.set()
            events.emit(kind, event)

    def order(self, order: Order) -> None:
        """Tell the standby ``order`` (nothing if it is gone already)."""
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError):
            self.process.stdin.write(order.value + "\n")
            self.process.stdin.flush()
            self.process.stdin.close()

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def wait(self, grace_s: float = STOP_GRACE_S) -> int:
        """Its exit code; its process group is killed if it has not ended after ``grace_s``,
        and whatever of the group outlives it (its JVM, which ignores SIGINT: a standby
        interrupted while its JVM starts leaves it behind) is killed once it ended, so its
        output reaches its end."""
        try:
            code = self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            code = self.process.wait()
        self.signal(signal.SIGKILL)
        self._relay.join()
        return code


class _Serialized(EventChannel):
    """The supervisor's channel, used by its relay threads and its own: one line at a time."""

    def __init__(self, channel: EventChannel) -> None:
        self._channel, self._lock = channel, threading.Lock()

    def emit(self, kind: str, payload: dict) -> None:
        with self._lock:
            self._channel.emit(kind, payload)

    def log(self, message: str) -> None:
        with self._lock:
            self._channel.log(message)


class Supervisor:
    """An active driver and a warm standby for one job (see the module docstring). ``command``
    is the driver's command line, ``python -m spark_jobs.commands ... run JOB ...``, without
    ``--standby``; ``watch_pid`` is the orchestrator process this one stops without."""

    def __init__(
        self,
        command: list[str],
        events: EventChannel,
        takeovers: int = TAKEOVERS,
        watch_pid: int | None = None,
        standby_retry_s: float = STANDBY_RETRY_S,
    ) -> None:
        self.command = command
        self.events = _Serialized(events)
        self.takeovers = takeovers
        self.watch_pid = watch_pid
        self.standby_retry_s = standby_retry_s
        self._standby_deaths = 0  # standbys that died waiting, since the last takeover
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # who the standby is: the run's thread and the launcher's
        self.active: Driver | None = None
        self.standby: Driver | None = None

    def run(self) -> int:
        """Until the active driver ends as no takeover would fix; returns its exit code (1 for
        a driver killed by a signal, as the orchestrator's restore would take it)."""
        previous = self._forward_signals()
        self.active = Driver(self.command, False, self.events)
        self._announce()
        self._replace_standby_when_running()
        made = 0
        try:
            while True:
                code = self._wait_active()
                died = time.time()
                if not takes_over(code) or made >= self.takeovers or self._stopping.is_set():
                    return self._end(code)
                with self._lock:
                    standby = self.standby
                if standby is None or standby.process.poll() is not None:
                    self.events.log(f"supervisor: the standby is gone; exit {code} ends the run")
                    return self._end(code)
                old, new = self.active.pid, standby.pid
                made += 1
                # said before the order: every event of the new attempt comes after it
                self.events.emit(
                    "takeover", {"from": old, "to": new, "exit": code, "at_ms": int(died * 1000)}
                )
                standby.order(Order.TAKE_OVER)
                with self._lock:
                    self.active, self.standby = standby, None
                    self._announce()
                self._standby_deaths = 0
                self.events.log(
                    f"supervisor: driver {old} exited {code}; {new} takes over "
                    f"(takeover {made} of at most {self.takeovers})"
                )
                if made < self.takeovers:  # a standby after the last takeover would idle
                    self._replace_standby_when_running()
        finally:
            for driver in (self.active, self.standby):
                if driver is not None and driver.process.poll() is None:
                    driver.signal(signal.SIGTERM)
                    driver.wait()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _wait_active(self) -> int:
        """The active driver's exit code; ends it (and this run) if the orchestrator is gone."""
        assert self.active is not None
        while True:
            try:
                return self.active.process.wait(timeout=WATCH_S)
            except subprocess.TimeoutExpired:
                pass
            self._replace_dead_standby()
            if self.watch_pid is not None and not alive(self.watch_pid):
                self.events.log(f"supervisor: the orchestrator process {self.watch_pid} is gone")
                self._stopping.set()
                self.active.signal(signal.SIGTERM)

    def _replace_dead_standby(self) -> None:
        """A standby that died while it waited (a crash, the OOM killer) is replaced, after a
        pause that doubles with each such death in a row: the run keeps its failover."""
        with self._lock:
            standby = self.standby
            if standby is None or standby.process.poll() is None or self._stopping.is_set():
                return
            self.standby = None
            self._announce()
        self._standby_deaths += 1
        delay = min(STANDBY_RETRY_MAX_S, self.standby_retry_s * 2 ** (self._standby_deaths - 1))
        self.events.log(
            f"supervisor: the standby {standby.pid} exited {standby.process.returncode} while "
            f"it waited; a new one in {delay:.0f} s"
        )
        self._replace_standby_when_running(delay)

    def _replace_standby_when_running(self, delay_s: float = 0.0) -> None:
        """A new standby, launched once the active driver has run its first micro-batch (so two
        JVMs' starts do not share the cores) and ``delay_s`` has passed, on a thread of its
        own; none if the active driver changed meanwhile (its takeover launches its own)."""
        active = self.active

        def launch() -> None:
            if self._stopping.wait(delay_s):
                return
            while active is self.active and not active.running.wait(WATCH_S):
                if active.process.poll() is not None or self._stopping.is_set():
                    return
            with self._lock:
                if active is self.active and not self._stopping.is_set():
                    self.standby = Driver(self.command, True, self.events)
                    self._announce()

        threading.Thread(target=launch, name="cutline-next-standby", daemon=True).start()

    def _announce(self) -> None:
        self.events.emit("drivers", {
            "active": self.active.pid if self.active else None,
            "standby": self.standby.pid if self.standby else None,
        })  # fmt: skip

    def _end(self, code: int) -> int:
        with self._lock:
            self._stopping.set()
            standby, self.standby = self.standby, None
        if standby is not None:
            standby.order(Order.STOP)
            standby.wait()
        assert self.active is not None
        self.active.wait()  # its output relayed to the end
        return code if code >= 0 else EXIT_FAILED

    def _forward_signals(self) -> dict[int, object]:
        """SIGTERM and SIGINT reach both drivers: the run ends as the orchestrator asked.
        Returns the handlers replaced (none off the main thread, where none can be set)."""

        def forward(sig: int, _frame) -> None:
            self._stopping.set()
            for driver in (self.active, self.standby):
                if driver is not None:
                    driver.signal(sig)

        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}


def driver_command(argv: list[str]) -> list[str]:
    """The children's command line: this ``cutline`` invocation's, without ``--standby`` and
    ``--takeovers``.
    Refused under ``spark-submit``: its JVM's settings would not reach the drivers, which each
    start their own, and its gateway must not be theirs."""
    if _GATEWAY_ENV in os.environ:
        raise ConfigurationError(
            "--standby starts its own drivers, each with its Spark session: run it as `cutline "
            "run` or `python -m spark_jobs.commands run` (with --conf for Spark settings), not "
            "through spark-submit"
        )
    drivers = []
    args = iter(argv)
    for a in args:
        if a == TAKEOVERS_FLAG:
            next(args, None)  # and its value: the supervisor's alone
        elif a != "--standby" and not a.startswith(f"{TAKEOVERS_FLAG}="):
            drivers.append(a)
    return [sys.executable, "-m", "spark_jobs.commands", *drivers]


def stand_by(
    log: Callable[[str], None],
    rewarm: Callable[[], None],
    stream: IO[str] | None = None,
    every_s: float = REWARM_S,
) -> bool:
    """In a standby child, once its session is warm: wait for the supervisor's order, calling
    ``rewarm`` every ``every_s`` meanwhile (Spark stops a Python worker idle for a minute);
    whether to take over."""
    stream = stream or sys.stdin
    log(f"standby driver {os.getpid()}: warm, waiting")
    while not select.select([stream], [], [], every_s)[0]:
        rewarm()
    return await_order(stream) is Order.TAKE_OVER
