"""Which Python PySpark runs and what its processes import first, and the class-data archive of
Spark's launcher: named in the environment before any thread starts.

PySpark reads ``PYSPARK_PYTHON`` (its workers' interpreter) and, under spark-submit,
``PYSPARK_DRIVER_PYTHON`` from the environment. The driver JVM inherits this process's
environment, and the Python processes it starts (the data source planners, the streaming source
runner) get its ``PYTHONPATH`` after Spark's zips: with :data:`WORKER_SITE` on it, they import
PySpark compiled instead of compiling it from the zip (spark_jobs/executor/python_path.py). Spark
gives the executors' workers that directory itself (``spark.executorEnv.PYTHONPATH``), but not
the planner that looks up installed data sources, which starts with every session: from the zip
it took 0.5 s of CPU, on the path to the first micro-batch. ``SPARK_LAUNCHER_OPTS`` names the
launcher's class-data archive (spark_jobs/deploy/class_archive.py) when it exists.

Writing the environment while another thread's native code reads it is undefined behaviour: a
driver crashed in libc (``strlen``) while delta-rs read the catalog on its plan thread and the
main thread set these variables. So the ``cutline`` command calls :func:`python_environment`
first, while it is the process's only thread, and :func:`spark_jobs.deploy.session.build_spark`
calls it again and finds nothing to write. A write of PySpark's Python with other threads running
is refused, loudly; the worker site and the launcher's archive, only speed-ups, are then left
out (as they are where the environment names its own).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from spark_jobs.deploy.class_archive import LAUNCHER_OPTS, launcher_java_options

PYTHON_VARIABLES = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
WORKER_SITE = Path(__file__).with_name("worker_site")  # its sitecustomize.py


def python_environment() -> None:
    """Name this interpreter as PySpark's Python where the environment names none, and, when
    this is the only thread, put :data:`WORKER_SITE` on ``PYTHONPATH`` where it is missing and
    name the launcher's archive where ``SPARK_LAUNCHER_OPTS`` is unset; raises ``RuntimeError``
    instead of writing PySpark's Python while other threads run."""
    values = {name: sys.executable for name in PYTHON_VARIABLES if name not in os.environ}
    if values or not _other_threads():
        path = os.environ.get("PYTHONPATH", "")
        if str(WORKER_SITE) not in path.split(os.pathsep):
            values["PYTHONPATH"] = os.pathsep.join(p for p in (path, str(WORKER_SITE)) if p)
        launcher = None if LAUNCHER_OPTS in os.environ else launcher_java_options()
        if launcher:
            values[LAUNCHER_OPTS] = launcher
    set_environment(values)


def set_environment(values: Mapping[str, str]) -> None:
    """Write ``values`` into this process's environment, which must have no other thread yet
    (``RuntimeError`` otherwise, nothing written)."""
    if not values:
        return
    others = _other_threads()
    if others:
        raise RuntimeError(
            f"{', '.join(values)} would be set while threads {others} run: set them before any "
            "thread starts (as the cutline command does first), or in the environment"
        )
    os.environ.update(values)


def _other_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t is not threading.current_thread()]
