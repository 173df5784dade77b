"""PySpark's Python, the worker site its processes import PySpark through and the launcher's class
archive are named in the environment before any thread starts, and never written while other
threads run (a setenv beside a native getenv crashed a driver)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

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


LAUNCHER_SCRIPT = """
import os, threading
from spark_jobs.deploy.class_archive import LAUNCHER_OPTS, archive_path
from spark_jobs.deploy.python_env import python_environment
stop = threading.Event()
if os.environ.get("THREADED"):
    threading.Thread(target=stop.wait, name="cutline-plan_0").start()
python_environment()
stop.set()
print(archive_path("launcher"))
print(os.environ.get(LAUNCHER_OPTS, "-"))
"""


def _launcher_opts(tmp_path, **env: str) -> tuple[str, str]:
    """The launcher archive's path, and ``SPARK_LAUNCHER_OPTS`` after ``python_environment`` in
    a process whose environment is this one's with ``env`` (PySpark's Python named)."""
    unset = ("SPARK_LAUNCHER_OPTS", "THREADED", "CUTLINE_CLASS_ARCHIVE")
    base = {k: v for k, v in os.environ.items() if k not in unset}
    base.update({name: sys.executable for name in PYTHON_VARIABLES})
    base.update({"CUTLINE_CLASS_ARCHIVE_DIR": str(tmp_path), **env})
    out = subprocess.run(
        [sys.executable, "-c", LAUNCHER_SCRIPT], env=base, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    path, opts = out.stdout.splitlines()
    return path, opts


def test_the_launchers_archive_is_named_when_it_exists_and_the_process_is_alone(tmp_path):
    path, opts = _launcher_opts(tmp_path)
    if path == "None":
        pytest.skip("no java: no archive to name")
    assert opts == "-", "no archive yet: nothing named"
    Path(path).write_bytes(b"archive")
    _, opts = _launcher_opts(tmp_path)
    assert opts.split() == [
        "-Xshare:auto",
        f"-XX:SharedArchiveFile={path}",
        "-Xlog:disable",
        "-Xlog:all=warning:stderr",  # the launcher's stdout is the command spark-class runs
    ]
    assert _launcher_opts(tmp_path, THREADED="1")[1] == "-", "a speed-up: never beside threads"
    assert _launcher_opts(tmp_path, CUTLINE_CLASS_ARCHIVE="off")[1] == "-"
    assert _launcher_opts(tmp_path, SPARK_LAUNCHER_OPTS="-Xmx64m")[1] == "-Xmx64m", "theirs kept"
    # spark-class splits the variable on blanks: an archive whose path has one is not named
    blank = tmp_path / "a b"
    blank.mkdir()
    path, _ = _launcher_opts(blank)
    Path(path).write_bytes(b"archive")
    assert _launcher_opts(blank)[1] == "-"
