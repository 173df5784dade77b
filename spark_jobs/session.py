"""The Spark session factory: Delta and the Kafka connector through ``spark.jars.packages``.

Packages resolve through Ivy into a local cache (``$CUTLINE_IVY_DIR``, default
``~/.cache/cutline/ivy``) from Maven Central, or from ``$CUTLINE_MAVEN_REPO`` when set (a mirror,
as in ``~/.m2/settings.xml``). ``local[*]`` unless a master is given.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from spark_jobs.java_check import require_java

SCALA = "2.13"
DELTA_VERSION = "4.4.0"


def spark_minor() -> str:
    return ".".join(pyspark.__version__.split(".")[:2])


def delta_package() -> str:
    return f"io.delta:delta-spark_{spark_minor()}_{SCALA}:{DELTA_VERSION}"


def kafka_packages() -> list[str]:
    """Spark's Kafka connector. Not resolvable from Maven Central as of this writing: it depends
    on spark-token-provider-kafka 4.2.0, which Central lacks (only 4.0.0 is published); the Kafka
    source must bring that dependency another way before ``kafka=True`` can work."""
    return [f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{pyspark.__version__}"]


def ivy_dir() -> Path:
    default = Path.home() / ".cache" / "cutline" / "ivy"
    return Path(os.environ.get("CUTLINE_IVY_DIR", default))


def session_conf(
    master: str | None = None,
    *,
    kafka: bool = False,
    shuffle_partitions: int = 4,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The configuration :func:`build_spark` applies (``extra`` wins)."""
    packages = [delta_package()] + (kafka_packages() if kafka else [])
    conf = {
        "spark.master": master or os.environ.get("CUTLINE_SPARK_MASTER", "local[*]"),
        "spark.jars.packages": ",".join(packages),
        "spark.jars.ivy": str(ivy_dir()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # A failed task fails the attempt; recovery is a restore from the latest checkpoint
        # (Flink's full restart), never a retry that could apply a micro-batch twice.
        "spark.task.maxFailures": "1",
        "spark.ui.showConsoleProgress": "false",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.session.timeZone": "UTC",
        # Python workers use this interpreter (the project's venv), not whatever is on PATH.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    if conf["spark.master"].startswith("local"):  # keep a local driver on loopback
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.ui.enabled"] = "false"
    repo = os.environ.get("CUTLINE_MAVEN_REPO")
    if repo:
        conf["spark.jars.repositories"] = repo
    conf.update(extra or {})
    return conf


def build_spark(
    master: str | None = None,
    app_name: str = "cutline",
    *,
    kafka: bool = False,
    shuffle_partitions: int = 4,
    extra: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create the session; raises ``JavaMissingError`` with a clear message without Java."""
    require_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    for key, value in session_conf(
        master, kafka=kafka, shuffle_partitions=shuffle_partitions, extra=extra
    ).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("CUTLINE_SPARK_LOG_LEVEL", "WARN"))
    return spark
