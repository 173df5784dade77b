"""The Spark distribution the installed PySpark carries: where it is (``bin/spark-submit``,
``bin/spark-class``, ``jars/``). Drivers, the standalone harness and the class archive all start
this one; nothing here starts it."""

from __future__ import annotations

from pathlib import Path

import pyspark


def spark_home() -> Path:
    """The Spark distribution inside the installed PySpark."""
    return Path(pyspark.__file__).parent
