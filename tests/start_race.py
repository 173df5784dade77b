"""The driver's start path run ``N`` times in one process with the race window widened:
``python tests/start_race.py N HOME ORDER [ROLE FLAGS]``. Each start runs the ``cutline run``
command itself (its environment set-up, the start plan reading and committing the catalog
through delta-rs on its own thread) up to the Spark session, where a stand-in for
``build_spark`` holds the main thread for as long as the plan runs, redoing the session's
environment step all that time.

ORDER ``fixed`` is the code as it is: the command names PySpark's Python first, so the session's
step writes nothing beside the plan thread. ORDER ``old`` is the order before the fix: nothing
named first, and the session's step writes the variables (as ``setdefault`` did) while the plan
thread runs. Every write to the environment is watched: one made while another thread exists is
counted. Prints ``ok N writes-beside-threads W`` if every start got through.

The old order writes no more than it did: enough to be counted, few enough that it rarely
provokes the crash itself. ORDER ``crash`` is the old order with the window's writes kept up
(new keys for as long as the plan thread runs, so that libc moves the environment's array under
its native reads): the crash itself, by hand, never in the suite (docs/design.md §5).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time

import spark_jobs.deploy.python_env as python_env
from spark_jobs.commands.main import main
from spark_jobs.deploy import session

VARIABLES = python_env.PYTHON_VARIABLES


class SessionStandIn(RuntimeError):
    """Where the start stops: the JVM need not start for the race."""


def plan_running() -> bool:
    return any(t.name.startswith("cutline-plan") for t in threading.enumerate())


def build_spark_old(*args, **kwargs):
    for name in VARIABLES:
        os.environ.setdefault(name, sys.executable)  # the old build_spark: new keys
    while plan_running():  # the window held open, writing nothing more
        time.sleep(0.01)
    raise SessionStandIn("stopped before the JVM")


def build_spark_crash(*args, **kwargs):
    for name in VARIABLES:
        os.environ.setdefault(name, sys.executable)
    added = 0
    while plan_running():
        os.environ[f"CUTLINE_RACE_{os.getpid()}_{added}"] = "1"
        added += 1
    for k in range(added):
        del os.environ[f"CUTLINE_RACE_{os.getpid()}_{k}"]
    raise SessionStandIn("stopped before the JVM")


def build_spark_fixed(*args, **kwargs):
    while plan_running():
        python_env.python_environment()  # the session's own step: nothing left to write
    raise SessionStandIn("stopped before the JVM")


def watch_writes() -> list[str]:
    """The names written to (or removed from) the environment while other threads ran."""
    beside: list[str] = []
    put, unset = os.putenv, os.unsetenv  # what os.environ's writes call

    def threads_now(key) -> None:
        if threading.active_count() > 1:
            beside.append(key.decode() if isinstance(key, bytes) else key)

    os.putenv = lambda key, value: (threads_now(key), put(key, value))[1]
    os.unsetenv = lambda key: (threads_now(key), unset(key))[1]
    return beside


def run(n: int, home: str, order: str, roles: list[str]) -> None:
    beside = watch_writes()
    stand_ins = {"old": build_spark_old, "crash": build_spark_crash, "fixed": build_spark_fixed}
    session.build_spark = stand_ins[order]
    if order != "fixed":
        python_env.python_environment = lambda: None  # nothing named before the plan thread
    for i in range(n):
        assert threading.active_count() == 1, threading.enumerate()
        for name in VARIABLES:
            os.environ.pop(name, None)  # as in a new process
        with contextlib.redirect_stderr(io.StringIO()) as err:
            code = main(["--home", home, "run", "clicks_per_user", "--idle-timeout", "1", *roles])
        assert code == 1 and "stopped before the JVM" in err.getvalue(), (i, err.getvalue())
        for t in threading.enumerate():
            if t is not threading.current_thread():
                t.join(30)
    print(f"ok {n} writes-beside-threads {len(beside)}")


if __name__ == "__main__":
    run(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:])
