"""The JVMs' class-data archives (the JDK's dynamic CDS): faster driver starts.

Every recovery is a fresh driver start, and a driver spends much of its start loading the
classes of Spark and the streaming query. A dynamic CDS archive, dumped once at the end
of a representative run (a short run of ``clicks_per_user`` and its restore), lets later JVMs
map those classes from one file instead of reading and verifying each jar entry again. Before
the driver's JVM, ``spark-submit`` runs Spark's launcher (a JVM over all of Spark's jars that
prints the driver's command line): it gets an archive of its own from the same run, through
``SPARK_LAUNCHER_OPTS`` (``launcher_java_options``; 0.18 -> 0.07 s a start).

- The archive is keyed by the Java runtime and the Spark distribution it was made with, down to
  each jar's size and time as the JVM checks them (``archive_path``); another Java, another
  Spark or the same one installed again finds no archive and starts as before.
- It is used when present (``driver_java_options``, added by ``session_conf``); the JVM checks
  it and starts without it if it does not match (``-Xshare:auto``), so a stale archive costs
  nothing but the speed-up. Both JVMs log that on stderr, never on their stdout (the command
  line ``spark-class`` runs, the output of the process a driver runs in).
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


def _archive_key() -> tuple[str, str] | None:
    """What the archives depend on, as two hashes: the place (the java executable, resolved, and
    where its Spark distribution is) and the install there (java's size and time, each jar's
    name, size and time: the JVM checks the class path jar by jar, so two environments, or one
    installed again, must not share an archive). None without java."""
    from spark_jobs.deploy.distribution import spark_home
    from spark_jobs.deploy.java_check import find_java

    java, _ = find_java()
    if java is None:
        return None
    real = Path(java).resolve()
    home = spark_home().resolve()
    stat = real.stat()
    install = [str(stat.st_size), str(int(stat.st_mtime))]
    for jar in sorted((home / "jars").glob("*.jar")):
        jar_stat = jar.stat()
        install.append(f"{jar.name} {jar_stat.st_size} {int(jar_stat.st_mtime)}")
    install.append("driver classpath: Spark's own and a job's packages, no Delta")
    return _digest([str(real), str(home)], 12), _digest(install, 12)


def _digest(parts: list[str], size: int) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:size]


def archive_dir() -> Path:
    default = Path.home() / ".cache" / "cutline" / "jvm"
    return Path(os.environ.get("CUTLINE_CLASS_ARCHIVE_DIR", default))


def archive_path(jvm: str = "driver") -> Path | None:
    """Where the archive of ``jvm`` (``driver`` or ``launcher``) for this Java and this Spark is
    (or would be); None without java."""
    key = _archive_key()
    return None if key is None else archive_dir() / f"{jvm}-{key[0]}-{key[1]}.jsa"


def superseded_archives() -> list[Path]:
    """Archives made for this Java and this Spark's place before they were installed again:
    no JVM can use them any more (each is over a hundred MiB)."""
    key = _archive_key()
    if key is None:
        return []
    current = {archive_path(jvm) for jvm in ("driver", "launcher")}
    made_here = archive_dir().glob(f"*-{key[0]}-*.jsa")
    return sorted(p for p in made_here if p not in current)


def _off() -> bool:
    return os.environ.get(OFF, "").lower() in ("off", "0", "false", "no")


# The JVM's own logging (a stale archive's warning, a dump's) goes to stderr: the launcher's
# stdout is what spark-class runs (lines before the command reach the driver's stdout, a warning
# printed at the launcher's exit would be glued to the driver's last argument), and the
# driver's stdout is its Python process's (a run's events, a caller's parsed output).
JVM_LOG_TO_STDERR = ("-Xlog:disable", "-Xlog:all=warning:stderr")
_JVM_LOG = " ".join(JVM_LOG_TO_STDERR)


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
    return f"-Xshare:auto -XX:SharedArchiveFile={path} {_JVM_LOG}"


def launcher_dump_options(path: Path) -> str:
    """``SPARK_LAUNCHER_OPTS`` of the process that makes the archives: dump to ``path`` (one
    that :func:`fits_launcher_opts`)."""
    return f"-XX:ArchiveClassesAtExit={path} {_JVM_LOG}"


def driver_java_options() -> list[str]:
    """The driver's JVM options for the archive: dump it (in the making process), use it (when
    it exists), or nothing."""
    dump = os.environ.get(DUMP_TO)
    if dump:
        return [f"-XX:ArchiveClassesAtExit={dump}", *JVM_LOG_TO_STDERR]
    if _off():
        return []
    path = archive_path()
    if path is None or not path.is_file():
        return []
    return ["-Xshare:auto", f"-XX:SharedArchiveFile={path}", *JVM_LOG_TO_STDERR]
