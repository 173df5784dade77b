"""PySpark from its installed package, not from the zip Spark puts first on a worker's path.

Spark starts every Python process it needs (the executors' worker daemons, and in the driver the
data source planners and the streaming source runner) with ``$SPARK_HOME/python/lib/pyspark.zip``
first on ``PYTHONPATH``. Modules imported from a zip are compiled again in every process (the zip
holds no bytecode): about a second of CPU for each one, several at each start of a job. When
PySpark is installed as a package (``pip install pyspark``), that zip is the package's own copy of
itself, and the installed modules, compiled once, are the same code.

:func:`prefer_installed_pyspark` moves the zips behind the installed package only in that case: a
Spark whose zip belongs to another installation (a Spark distribution's ``SPARK_HOME``) keeps its
order, so a worker never mixes two versions of PySpark.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence


def _spark_zip(entry: str) -> bool:
    name = os.path.basename(entry)
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith("-src.zip"))


def prefer_installed_pyspark(path: Sequence[str]) -> list[str]:
    """``path`` with Spark's zips moved to its end when they are the installed PySpark's own
    (``<installed pyspark>/python/lib/``); otherwise ``path`` unchanged."""
    zips = [p for p in path if _spark_zip(p)]
    rest = [p for p in path if not _spark_zip(p)]
    if not zips:
        return list(path)
    spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if spec is None or not spec.submodule_search_locations:
        return list(path)  # PySpark only in the zip: it stays
    package = os.path.realpath(next(iter(spec.submodule_search_locations)))
    own = os.path.join(package, "python", "lib")
    if all(os.path.realpath(os.path.dirname(z)) == own for z in zips):
        return rest + zips
    return list(path)


def use_installed_pyspark() -> None:
    """Reorder ``sys.path`` as :func:`prefer_installed_pyspark` says; call before PySpark is
    imported."""
    sys.path[:] = prefer_installed_pyspark(sys.path)


def run_next_sitecustomize(this: str) -> None:
    """Run the ``sitecustomize`` module that ``sys.path`` holds after the one in ``this`` file's
    directory, if any: Cutline's hook stands in front of a deployment's own, not instead of it."""
    here = os.path.realpath(os.path.dirname(this))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
