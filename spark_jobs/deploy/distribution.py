"""The Spark distribution the installed PySpark carries: where it is (``bin/spark-submit``,
``bin/spark-class``, ``jars/``). Drivers, the standalone harness and the class archive all start
this one; nothing here starts it. Nothing here imports PySpark either (the ``cutline`` command
asks before any of its commands needs it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def spark_home() -> Path:
    """The Spark distribution inside the installed PySpark."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("no PySpark installed")
    return Path(next(iter(spec.submodule_search_locations)))
