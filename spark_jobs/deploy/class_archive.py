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
  nothing but the speed-up. The launcher's JVM logs that on stderr, not on its stdout (the
  command line ``spark-class`` runs).
- ``python -m spark_jobs.commands.class_archive`` makes it when missing (``make demo`` and
  ``make test`` do; the making runs the ``cutline`` command, so it lives with the commands);
  ``CUTLINE_CLASS_ARCHIVE=off`` turns its use off.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

OFF = "CUTLINE_CLASS_ARCHIVE"
# set in the process whose JVM dumps the archive, to where it writes it
DUMP_TO = "CUTLINE_CLASS_ARCHIVE_DUMP"
LAUNCHER_OPTS = "SPARK_LAUNCHER_OPTS"  # the JVM options spark-class gives Spark's launcher


def _archive_key() -> str | None:
    """What the archives depend on: the java executable (resolved, with its size and time), and
    where its Spark distribution is with the jars it holds, whose names carry Spark's version
    (the JVM checks the class path by path: two environments' archives must not share a name).
    None without java."""
    from spark_jobs.deploy.distribution import spark_home
    from spark_jobs.deploy.java_check import find_java

    java, _ = find_java()
    if java is None:
        return None
    real = Path(java).resolve()
    stat = real.stat()
    home = spark_home().resolve()
    jars = sorted(p.name for p in (home / "jars").glob("*.jar"))
    parts = [str(real), str(stat.st_size), str(int(stat.st_mtime))]
    parts += [str(home), *jars]
    parts.append("driver classpath: Spark's own and a job's packages, no Delta")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def archive_dir() -> Path:
    default = Path.home() / ".cache" / "cutline" / "jvm"
    return Path(os.environ.get("CUTLINE_CLASS_ARCHIVE_DIR", default))


def archive_path(jvm: str = "driver") -> Path | None:
    """Where the archive of ``jvm`` (``driver`` or ``launcher``) for this Java and this Spark is
    (or would be); None without java."""
    key = _archive_key()
    return None if key is None else archive_dir() / f"{jvm}-{key}.jsa"


def _off() -> bool:
    return os.environ.get(OFF, "").lower() in ("off", "0", "false", "no")


# The launcher's stdout is what spark-class runs: lines before the command reach the driver's
# stdout (where a run's events may go), and a warning printed at the launcher's exit (while it
# dumps) would be glued to the driver's last argument. The JVM's own logging goes to stderr.
_LAUNCHER_LOG = "-Xlog:disable -Xlog:all=warning:stderr"


def fits_launcher_opts(path: Path) -> bool:
    """``path`` stays one word in ``SPARK_LAUNCHER_OPTS``, which spark-class splits on blanks
    and expands as globs."""
    return not re.search(r"[\s*?\[]", str(path))


def launcher_java_options() -> str | None:
    """``SPARK_LAUNCHER_OPTS`` for the launcher's archive when it exists (and use is not off);
    None otherwise, and where its path would not survive spark-class's word splitting."""
    path = None if _off() else archive_path("launcher")
    if path is None or not path.is_file() or not fits_launcher_opts(path):
        return None
    return f"-Xshare:auto -XX:SharedArchiveFile={path} {_LAUNCHER_LOG}"


def launcher_dump_options(path: Path) -> str:
    """``SPARK_LAUNCHER_OPTS`` of the process that makes the archives: dump to ``path`` (one
    that :func:`fits_launcher_opts`)."""
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
