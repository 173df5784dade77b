"""The Spark session factory: a job's packages (the Kafka connector; Delta Lake on request)
through ``spark.jars.packages``.

Packages resolve through Ivy into a local cache (``$CUTLINE_IVY_DIR``, default
``~/.cache/cutline/ivy``) from Maven Central, or from ``$CUTLINE_MAVEN_REPO`` when set (a mirror,
as in ``~/.m2/settings.xml``). The first start records the jars it resolved; later starts with
the same packages pass those files as ``spark.jars`` and skip the resolution. ``local[*]``
unless a master is given.

Quiet (the ``cutline`` command unless ``--verbose``): the driver logs through
``log4j2-quiet.properties`` (warnings and errors, without the start-up ones), and the output of
the JVM's start in a local driver (Ivy's resolution report, the JDK's notices) is held back and
shown only if the session fails to start.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from cutline.sources.dependencies import (
    NO_DEPENDENCIES,
    SCALA,
    SparkDependencies,
    ivy_dir,
)
from spark_jobs.deploy.class_archive import driver_java_options
from spark_jobs.deploy.distribution import spark_home
from spark_jobs.deploy.java_check import require_java
from spark_jobs.deploy.python_env import WORKER_SITE, python_environment

DELTA_VERSION = "4.4.0"
# the script spark-submit runs: the ``cutline`` command line's entry point
CLI_SCRIPT = str(Path(__file__).resolve().parent.parent / "commands" / "main.py")
# How long a local session's driver waits for its own executor's heartbeat: a day, not Spark's
# 120 s (see session_conf).
LOCAL_HEARTBEAT_TIMEOUT_MS = 24 * 3600 * 1000
CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def spark_minor() -> str:
    return ".".join(pyspark.__version__.split(".")[:2])


def delta_package() -> str:
    return f"io.delta:delta-spark_{spark_minor()}_{SCALA}:{DELTA_VERSION}"


def session_conf(
    master: str | None = None,
    *,
    needs: SparkDependencies = NO_DEPENDENCIES,
    shuffle_partitions: int = 4,
    extra: Mapping[str, str] | None = None,
    quiet: bool = False,
    delta: bool = False,
) -> dict[str, str]:
    """The configuration :func:`build_spark` applies: what the job's sources ``needs`` on the
    classpath, and with ``delta`` Delta Lake's package and SQL extension, for reading the
    output or the catalog with Spark (the runtime needs neither: every Delta table it writes
    is written through delta-rs). ``extra`` wins, but for the driver's JVM options: its own
    come after Cutline's (the class archive, the quiet logging), which they override one by one
    instead of dropping them all."""
    packages = [*([delta_package()] if delta else []), *needs.packages]
    conf = {
        "spark.master": master or os.environ.get("CUTLINE_SPARK_MASTER", "local[*]"),
        "spark.jars.ivy": str(ivy_dir()),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Python workers fork from a daemon that imported the runtime's modules already
        "spark.python.daemon.module": "spark_jobs.executor.worker_daemon",
        # ... and one daemon serves both the RDD jobs (restores) and the SQL ones (micro-batches):
        # Spark keeps a daemon per distinct worker environment, and SQL adds this variable to
        # its workers' (simplified tracebacks, its default), so RDD workers get it too
        "spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK": "1",
        # every Python process Spark starts imports PySpark compiled, not from Spark's zip
        "spark.executorEnv.PYTHONPATH": str(WORKER_SITE),
        # A failed task fails the attempt; recovery is a restore from the latest checkpoint
        # (Flink's full restart), never a retry that could apply a micro-batch twice.
        "spark.task.maxFailures": "1",
        # A subtask's micro-batch task waits for an executor on the host that holds its working
        # state instead of running elsewhere after 3 s (placement.py); a host without
        # executors gives no preference, so nothing waits for a host that is gone.
        "spark.locality.wait.node": "1h",
        # Spark's own streaming checkpoint is the query's scratch (driver/scratch.py; positions
        # are Cutline's): written through FileSystem, a rename, not FileContext, whose renames
        # on the local disk shell out to `readlink` for every file without Hadoop's native
        # library (eight processes per micro-batch, 35 ms of a small one's; two `chmod`s per
        # file stay)
        "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": os.environ.get("CUTLINE_SPARK_LOG_LEVEL", "WARN"),
        "spark.sql.session.timeZone": "UTC",
        # Python workers use this interpreter (the project's venv), not whatever is on PATH.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    if packages:
        conf["spark.jars.packages"] = ",".join(packages)
    if delta:
        conf["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
        conf["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        conf["spark.databricks.delta.snapshotPartitions"] = "2"
    master_url = conf["spark.master"]
    if master_url.startswith("local"):
        # The only executor runs in the driver's JVM, so it cannot be lost on its own; a pause
        # of the machine longer than the heartbeat timeout (120 s) would otherwise remove it and
        # leave a session that can never run a task again (its heartbeater then exits the JVM).
        conf["spark.storage.blockManagerHeartbeatTimeoutMs"] = str(LOCAL_HEARTBEAT_TIMEOUT_MS)
    if master_url.startswith(("local", "spark://127.", "spark://localhost")):
        # a driver for a local or loopback cluster stays on loopback, whatever the hostname says
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.ui.enabled"] = "false"
    if needs.excludes:
        conf["spark.jars.excludes"] = ",".join(needs.excludes)
    if needs.jars:
        conf["spark.jars"] = ",".join(needs.jars)
    repo = os.environ.get("CUTLINE_MAVEN_REPO")
    if repo:
        conf["spark.jars.repositories"] = repo
    java_options = [*driver_java_options(), *DRIVER_JIT]
    if quiet:
        java_options.append(f"-Dlog4j2.configurationFile={QUIET_LOG4J}")
    extra = dict(extra or {})
    own = extra.pop(DRIVER_JAVA_OPTIONS, "").strip()
    # the caller's own options after Cutline's: of two conflicting ones, the JVM takes the last
    conf[DRIVER_JAVA_OPTIONS] = " ".join(filter(None, [*java_options, own]))
    conf.update(extra)
    jars = resolved_jars(conf)
    if jars:  # resolved before: the same jars, without Ivy's resolution at every start
        for key in RESOLUTION_KEYS:
            conf.pop(key, None)
        conf["spark.jars"] = ",".join(jars)
    return conf


DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# The driver JVM compiles with C1 alone: no profiled tier, no C2. In local mode it is the
# executor too, but a micro-batch's work in it is moving Arrow batches between Spark and the
# Python workers and through the subtask shuffle; the state's work runs in Python. On two cores,
# a new JVM's profiled code and C2's compiles beside it took the start's CPU: a cold restart of
# the peer benchmark's job at 100 MiB reached its first micro-batch in 6.89 s against 7.82 with
# C2 for methods ten times hotter than by default (medians of three, alternated), its later
# micro-batches no longer (1.18 against 1.26 s); over the peer benchmark's ten minutes at 1 GiB,
# 120,432 records/s against 103,607 (bench/results/README.md, its first section). A caller's
# ``-XX:TieredStopAtLevel=4`` (after Cutline's options: the last wins) brings C2 back.
DRIVER_JIT = ("-XX:TieredStopAtLevel=1",)
QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")

# What Ivy's resolution depends on; a start with the same values gets the same jars.
RESOLUTION_KEYS = ("spark.jars.packages", "spark.jars.excludes", "spark.jars.repositories")


def _resolution_record(conf: Mapping[str, str]) -> Path | None:
    """Where the jars resolved for ``conf``'s packages are recorded (None: no packages)."""
    import hashlib

    if not conf.get("spark.jars.packages"):
        return None
    key = "\n".join(f"{k}={conf.get(k, '')}" for k in RESOLUTION_KEYS)
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return Path(conf.get("spark.jars.ivy") or ivy_dir()) / "resolved" / f"{digest}.txt"


def _complete(conf: Mapping[str, str], jars: list[str]) -> bool:
    """Every jar exists, and every package of ``conf`` is among them (Ivy names the jar of
    ``group:artifact:version`` ``group_artifact-version.jar``)."""
    names = {Path(j).name for j in jars}
    packages = [p.split(":") for p in conf["spark.jars.packages"].split(",") if p]
    return (
        bool(jars)
        and all(f"{g}_{a}-{v}.jar" in names for g, a, v in packages)
        and all(Path(j).is_file() for j in jars)
    )


def resolved_jars(conf: Mapping[str, str]) -> list[str] | None:
    """The jars an earlier start resolved for ``conf``'s packages, if it recorded them and
    every one is still in the cache; else None (Ivy resolves them again). Only for a
    configuration that names no jars of its own."""
    record = _resolution_record(conf)
    if record is None or conf.get("spark.jars") or not record.is_file():
        return None
    jars = record.read_text().split()
    return jars if _complete(conf, jars) else None


def remember_resolved_jars(conf: Mapping[str, str], spark_jars: str) -> None:
    """Record the jars Ivy resolved for ``conf`` (``spark.jars`` of the started session: Spark
    puts the resolved files there), so later starts skip the resolution (about 1 s and the
    JVM's work behind it, on every driver start)."""
    from urllib.parse import urlparse

    record = _resolution_record(conf)
    if record is None or conf.get("spark.jars") or record.is_file():
        return  # jars of its own hide the resolved ones from spark.jars
    jars = [urlparse(j).path if j.startswith("file:") else j for j in spark_jars.split(",") if j]
    if not _complete(conf, jars):
        return
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text("\n".join(jars) + "\n")
    os.replace(tmp, record)


def build_spark(
    master: str | None = None,
    app_name: str = "cutline",
    *,
    needs: SparkDependencies = NO_DEPENDENCIES,
    shuffle_partitions: int = 4,
    extra: Mapping[str, str] | None = None,
    quiet: bool = False,
    delta: bool = False,
) -> SparkSession:
    """Get or create the session (``quiet``: see the module docstring); raises
    ``JavaMissingError`` with a clear message without Java."""
    require_java()
    python_environment()
    builder = SparkSession.builder.appName(app_name)
    for key, value in executor_env(os.environ, extra or {}).items():
        builder = builder.config(key, value)
    if launched_by_spark_submit():  # spark-submit applied submit_command()'s conf
        return builder.getOrCreate()
    options = dict(needs=needs, shuffle_partitions=shuffle_partitions, extra=extra, quiet=quiet)
    applied = session_conf(master, **options, delta=delta)
    with one_resolution_at_a_time(applied):
        if applied.get("spark.jars.packages"):  # another start may have resolved them meanwhile
            applied = session_conf(master, **options, delta=delta)
        for key, value in applied.items():
            builder = builder.config(key, value)
        if quiet:
            with jvm_start_output_held():
                spark = builder.getOrCreate()
        else:
            spark = builder.getOrCreate()
        if applied.get("spark.jars.packages"):  # resolved by Ivy in this start
            remember_resolved_jars(applied, spark.sparkContext.getConf().get("spark.jars") or "")
    return spark


def stop_spark(spark: SparkSession) -> None:
    """Stop the session (its JVM's context: jobs, executors, listeners) without waiting for
    PySpark's accumulator server, as ``SparkSession.stop`` does: that server's one connection
    handler looks for its end once a second, which cost about 1 s at the end of every run. The
    server is told to end and ends on a daemon thread of its own (its socket closed then, or
    with the process); no accumulator update can come after the context stopped."""
    context = spark.sparkContext
    server = getattr(context, "_accumulatorServer", None)
    context._accumulatorServer = None  # PySpark's stop skips what it does not have
    spark.stop()
    if server is not None:
        threading.Thread(target=server.shutdown, name="accumulator-stop", daemon=True).start()


@contextmanager
def one_resolution_at_a_time(conf: Mapping[str, str]) -> Iterator[None]:
    """Inside, this process is the only one resolving packages into ``conf``'s Ivy cache (an
    exclusive lock on a file in it), when ``conf`` has packages to resolve: Ivy's cache is not
    safe for two resolutions at once (two drivers, or two test workers, starting on a fresh
    machine). Without packages, no lock."""
    if not conf.get("spark.jars.packages"):
        yield
        return
    import fcntl

    cache = Path(conf.get("spark.jars.ivy") or ivy_dir())
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "resolution.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


# where S3 is and in which region: the executors open the checkpoint root (and a file source)
# themselves, and a worker's own environment need not say it; credentials are never passed (the
# executors' own chain supplies them: environment, profile, instance or pod role)
EXECUTOR_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_REGION")


def executor_env(environ: Mapping[str, str], conf: Mapping[str, str]) -> dict[str, str]:
    """``spark.executorEnv.*`` for the S3 endpoint and region this driver has in ``environ``,
    unless ``conf`` sets them."""
    out = {}
    for name in EXECUTOR_ENV:
        key = f"spark.executorEnv.{name}"
        if environ.get(name) and key not in conf:
            out[key] = environ[name]
    return out


@contextmanager
def jvm_start_output_held() -> Iterator[None]:
    """A JVM launched inside inherits a stderr that is a pipe: what it writes until the block
    ends (Ivy's resolution report, the JDK's notices) is held, and printed only if the block
    raises; what it writes later is passed on to the real stderr. Python's own writes to
    ``sys.stderr`` are not held."""
    sys.stderr.flush()
    real = os.dup(2)
    read_end, write_end = os.pipe()
    held: list[bytes] = []
    started = threading.Event()

    def forward() -> None:
        with os.fdopen(read_end, "rb") as pipe:
            for line in pipe:
                if started.is_set():
                    os.write(real, line)
                else:
                    held.append(line)

    threading.Thread(target=forward, name="jvm-stderr", daemon=True).start()
    python_stderr = sys.stderr
    sys.stderr = open(real, "w", closefd=False)  # noqa: SIM115 (restored below)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    except BaseException:
        os.write(real, b"".join(held))
        raise
    finally:
        started.set()
        os.dup2(real, 2)
        sys.stderr.flush()
        sys.stderr = python_stderr


def launched_by_spark_submit() -> bool:
    """True in a Python driver that ``spark-submit`` started (its JVM is already configured)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


@dataclass(frozen=True)
class SubmitCommand:
    """A ``spark-submit`` command line and the environment it needs on top of the caller's."""

    argv: list[str]
    env: dict[str, str]


def submit_command(
    app_args: list[str],
    master: str | None = None,
    *,
    needs: SparkDependencies = NO_DEPENDENCIES,
    extra: Mapping[str, str] | None = None,
    quiet: bool = False,
) -> SubmitCommand:
    """``spark-submit`` of the ``cutline`` CLI with ``app_args``, configured by
    :func:`session_conf` (the same master, packages and conf as :func:`build_spark`), using the
    installed PySpark's own Spark distribution."""
    home = spark_home()
    argv = [str(home / "bin" / "spark-submit")]
    for key, value in session_conf(master, needs=needs, extra=extra, quiet=quiet).items():
        argv += ["--conf", f"{key}={value}"]
    env = {"SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable}
    return SubmitCommand([*argv, CLI_SCRIPT, *app_args], env)
