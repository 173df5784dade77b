"""Which Python PySpark runs: this interpreter, named in the environment before any thread
starts.

PySpark reads ``PYSPARK_PYTHON`` (its workers' interpreter) and, under spark-submit,
``PYSPARK_DRIVER_PYTHON`` from the environment. Writing the environment while another thread's
native code reads it is undefined behaviour: a driver crashed in libc (``strlen``) while delta-rs
read the catalog on its plan thread and the main thread set these variables. So the ``cutline``
command calls :func:`python_environment` first, while it is the process's only thread, and
:func:`spark_jobs.deploy.session.build_spark` calls it again and finds nothing to write. A write
with other threads running is refused, loudly.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping

PYTHON_VARIABLES = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


def python_environment() -> None:
    """Name this interpreter as PySpark's Python where the environment names none; raises
    ``RuntimeError`` instead of writing while other threads run."""
    set_environment({name: sys.executable for name in PYTHON_VARIABLES if name not in os.environ})


def set_environment(values: Mapping[str, str]) -> None:
    """Write ``values`` into this process's environment, which must have no other thread yet
    (``RuntimeError`` otherwise, nothing written)."""
    if not values:
        return
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        raise RuntimeError(
            f"{', '.join(values)} would be set while threads {others} run: set them before any "
            "thread starts (as the cutline command does first), or in the environment"
        )
    os.environ.update(values)
