"""PySpark's Python, and the worker site its processes import PySpark through, are named in the
environment before any thread starts, and never written while other threads run (a setenv
beside a native getenv crashed a driver)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from spark_jobs.deploy.python_env import PYTHON_VARIABLES, WORKER_SITE, python_environment

SCRIPT = """
import os, sys, threading
from spark_jobs.deploy.python_env import WORKER_SITE, python_environment
python_environment()  # alone: written
print(os.environ["PYSPARK_PYTHON"] == os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable)
print(os.environ["PYTHONPATH"].split(os.pathsep) == ["/their/path", str(WORKER_SITE)])
del os.environ["PYSPARK_PYTHON"]
stop = threading.Event()
threading.Thread(target=stop.wait, name="cutline-plan_0").start()
try:
    python_environment()
except RuntimeError as e:
    print(e)
finally:
    stop.set()
print("PYSPARK_PYTHON" in os.environ)
"""


def test_written_before_threads_start_and_refused_after():
    env = {k: v for k, v in os.environ.items() if k not in PYTHON_VARIABLES}
    env["PYTHONPATH"] = "/their/path"
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    written, site, refused, left = out.stdout.splitlines()
    assert written == site == "True"  # the worker site after what was there
    assert refused.startswith("PYSPARK_PYTHON would be set while threads ['cutline-plan_0'] run")
    assert left == "False"  # nothing written


def test_nothing_is_written_when_the_environment_names_them(monkeypatch):
    """Not even the worker site, which is only a speed-up, while other threads run."""
    for name in PYTHON_VARIABLES:
        monkeypatch.setenv(name, "/opt/python")
    monkeypatch.setenv("PYTHONPATH", "/their/path")
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        python_environment()  # a no-op, threads or not
    finally:
        stop.set()
        thread.join()
    assert all(os.environ[name] == "/opt/python" for name in PYTHON_VARIABLES)
    assert os.environ["PYTHONPATH"] == "/their/path"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/their/path", str(WORKER_SITE)]))
    python_environment()  # already there: nothing to write either


def test_the_command_names_them_before_anything_else():
    """``cutline`` names them first thing (before it parses its arguments, long before the plan
    thread and the JVM start)."""
    code = (
        "import os\n"
        "from spark_jobs.commands.main import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    print(os.environ.get('PYSPARK_PYTHON'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in PYTHON_VARIABLES}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == sys.executable
