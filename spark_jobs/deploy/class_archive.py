"""The JVMs' class-data archives (the JDK's dynamic CDS): faster driver starts.

Every recovery is a fresh driver start, and a driver spends much of its start loading the
classes of Spark and the streaming query. A dynamic CDS archive, dumped once at the end
of a representative run (a short run of ``clicks_per_user`` and its restore), lets later JVMs
map those classes from one file instead of reading and verifying each jar entry again. Before
the driver's JVM, ``spark-submit`` runs Spark's launcher (a JVM over all of Spark's jars that
prints the driver's command line): it gets an archive of its own from the same run, through
``SPARK_LAUNCHER_OPTS`` (``launcher_java_options``; 0.18 -> 0.07 s a start).

- The archive is keyed by the Java runtime and the Spark distribution it was made with
  (``archive_path``); another Java or another Spark finds no archive and starts as before.
- It is used when present (``driver_java_options``, added by ``session_conf``); the JVM checks
  it and starts without it if it does not match (``-Xshare:auto``), so a stale archive costs
  nothing but the speed-up. The launcher's JVM says so on stderr, never on its stdout (the
  command line ``spark-class`` runs).
- ``python -m spark_jobs.commands.class_archive`` makes it when missing (``make demo`` and
  ``make test`` do; the making runs the ``cutline`` command, so it lives with the commands);
  ``CUTLINE_CLASS_ARCHIVE=off`` turns its use off.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

OFF = "CUTLINE_CLASS_ARCHIVE"
# set in the process whose JVM dumps the archive, to where it writes it
DUMP_TO = "CUTLINE_CLASS_ARCHIVE_DUMP"


def _archive_key() -> str | None:
    """What the archive depends on: the java executable (resolved, with its size and time),
    the PySpark version, and where its Spark distribution is with the jars it holds (the JVM
    checks the class path by path: two environments' archives must not share a name). None
    without java."""
    import pyspark

    from spark_jobs.deploy.distribution import spark_home
    from spark_jobs.deploy.java_check import find_java

    java, _ = find_java()
    if java is None:
        return None
    real = Path(java).resolve()
    stat = real.stat()
    home = spark_home().resolve()
    jars = sorted(p.name for p in (home / "jars").glob("*.jar"))
    parts = [str(real), str(stat.st_size), str(int(stat.st_mtime)), pyspark.__version__]
    parts += [str(home), *jars]
    parts.append("driver classpath: Spark's own and a job's packages, no Delta")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def archive_dir() -> Path:
    default = Path.home() / ".cache" / "cutline" / "jvm"
    return Path(os.environ.get("CUTLINE_CLASS_ARCHIVE_DIR", default))


def archive_path() -> Path | None:
    """Where the archive for this Java and this Spark is (or would be); None without java."""
    key = _archive_key()
    return None if key is None else archive_dir() / f"driver-{key}.jsa"


def launcher_archive_path() -> Path | None:
    """Where the launcher's archive for this Java and this Spark is (or would be)."""
    key = _archive_key()
    return None if key is None else archive_dir() / f"launcher-{key}.jsa"


def _off() -> bool:
    return os.environ.get(OFF, "").lower() in ("off", "0", "false", "no")


# the launcher's stdout is the command line spark-class runs (what precedes it reaches the driver's
# stdout, where a run's events may go): the JVM's own warnings go to stderr
_LAUNCHER_LOG = "-Xlog:disable -Xlog:all=warning:stderr"


def launcher_java_options() -> str | None:
    """``SPARK_LAUNCHER_OPTS`` for the launcher's archive when it exists (and use is not off);
    None otherwise."""
    path = None if _off() else launcher_archive_path()
    if path is None or not path.is_file():
        return None
    return f"-Xshare:auto -XX:SharedArchiveFile={path} {_LAUNCHER_LOG}"


def launcher_dump_options(path: Path) -> str:
    """``SPARK_LAUNCHER_OPTS`` of the process that makes the archives: dump to ``path``."""
    return f"-XX:ArchiveClassesAtExit={path} {_LAUNCHER_LOG}"


def driver_java_options() -> list[str]:
    """The driver's JVM options for the archive: dump it (in the making process), use it (when
    it exists), or nothing."""
    dump = os.environ.get(DUMP_TO)
    if dump:
        return [f"-XX:ArchiveClassesAtExit={dump}"]
    if _off():
        return []
    path = archive_path()
    if path is None or not path.is_file():
        return []
    return ["-Xshare:auto", f"-XX:SharedArchiveFile={path}"]
