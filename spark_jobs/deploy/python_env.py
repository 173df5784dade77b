"""Which Python PySpark runs and what its processes import first: named in the environment
before any thread starts.

PySpark reads ``PYSPARK_PYTHON`` (its workers' interpreter) and, under spark-submit,
``PYSPARK_DRIVER_PYTHON`` from the environment. The driver JVM inherits this process's
environment, and the Python processes it starts (the data source planners, the streaming source
runner) get its ``PYTHONPATH`` after Spark's zips: with :data:`WORKER_SITE` on it, they import
PySpark compiled instead of compiling it from the zip (spark_jobs/executor/python_path.py). Spark
gives the executors' workers that directory itself (``spark.executorEnv.PYTHONPATH``), but not
the planner that looks up installed data sources, which starts with every session: from the zip
it took 0.5 s of CPU, on the path to the first micro-batch.

Writing the environment while another thread's native code reads it is undefined behaviour: a
driver crashed in libc (``strlen``) while delta-rs read the catalog on its plan thread and the
main thread set these variables. So the ``cutline`` command calls :func:`python_environment`
first, while it is the process's only thread, and :func:`spark_jobs.deploy.session.build_spark`
calls it again and finds nothing to write. A write of PySpark's Python with other threads running
is refused, loudly; the worker site, only a speed-up, is then left out.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

PYTHON_VARIABLES = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
WORKER_SITE = Path(__file__).with_name("worker_site")  # its sitecustomize.py


def python_environment() -> None:
    """Name this interpreter as PySpark's Python where the environment names none, and put
    :data:`WORKER_SITE` on ``PYTHONPATH`` when it is missing and this is the only thread;
    raises ``RuntimeError`` instead of writing PySpark's Python while other threads run."""
    values = {name: sys.executable for name in PYTHON_VARIABLES if name not in os.environ}
    path = os.environ.get("PYTHONPATH", "")
    if str(WORKER_SITE) not in path.split(os.pathsep) and (values or not _other_threads()):
        values["PYTHONPATH"] = os.pathsep.join(p for p in (path, str(WORKER_SITE)) if p)
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
