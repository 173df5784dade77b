"""What a source needs on Spark's classpath, and where it comes from: the Maven packages Spark
resolves (``spark.jars.packages``) for its Scala version, from the repository and Ivy cache
that every resolution of Cutline's shares (``CUTLINE_MAVEN_REPO``, ``CUTLINE_IVY_DIR``).
A source declares its needs here; the runtime's session puts them on the classpath."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SCALA = "2.13"  # the Scala version of the Spark that PySpark ships


@dataclass(frozen=True)
class SparkDependencies:
    """What a source needs on Spark's classpath: Maven ``packages`` (``group:artifact:version``,
    resolved through ``spark.jars.packages``), ``excludes`` from their resolution, and ``jars``
    (local paths)."""

    packages: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    jars: tuple[str, ...] = ()


NO_DEPENDENCIES = SparkDependencies()


def maven_repo() -> str:
    """The Maven repository packages and extra jars are fetched from."""
    return os.environ.get("CUTLINE_MAVEN_REPO", "https://repo1.maven.org/maven2").rstrip("/")


def ivy_dir() -> Path:
    """Where resolved packages (and extra jars, under ``extra/``) are kept between runs."""
    default = Path.home() / ".cache" / "cutline" / "ivy"
    return Path(os.environ.get("CUTLINE_IVY_DIR", default))
