"""The driver JVM's class-data archive (the JDK's dynamic CDS): faster driver starts.

Every recovery is a fresh driver start, and a driver spends much of its start loading the
classes of Spark and the streaming query. A dynamic CDS archive, dumped once at the end
of a representative run (a short run of ``clicks_per_user`` and its restore), lets later JVMs
map those classes from one file instead of reading and verifying each jar entry again.

- The archive is keyed by the Java runtime and the Spark distribution it was made with
  (``archive_path``); another Java or another Spark finds no archive and starts as before.
- It is used when present (``driver_java_options``, added by ``session_conf``); the JVM checks
  it and starts without it if it does not match (``-Xshare:auto``), so a stale archive costs
  nothing but the speed-up.
- ``python -m spark_jobs.deploy.class_archive`` makes it when missing (``make demo`` and
  ``make test`` do); ``CUTLINE_CLASS_ARCHIVE=off`` turns its use off.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyspark

OFF = "CUTLINE_CLASS_ARCHIVE"
# set in the process whose JVM dumps the archive, to where it writes it
DUMP_TO = "CUTLINE_CLASS_ARCHIVE_DUMP"


def _archive_key() -> str | None:
    """What the archive depends on: the java executable (resolved, with its size and time),
    the PySpark version and the jars of its Spark distribution. None without java."""
    from spark_jobs.deploy.java_check import find_java
    from spark_jobs.deploy.session import spark_home

    java, _ = find_java()
    if java is None:
        return None
    real = Path(java).resolve()
    stat = real.stat()
    jars = sorted(p.name for p in (spark_home() / "jars").glob("*.jar"))
    parts = [str(real), str(stat.st_size), str(int(stat.st_mtime)), pyspark.__version__, *jars]
    parts.append("driver classpath: Spark's own and a job's packages, no Delta")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def archive_dir() -> Path:
    default = Path.home() / ".cache" / "cutline" / "jvm"
    return Path(os.environ.get("CUTLINE_CLASS_ARCHIVE_DIR", default))


def archive_path() -> Path | None:
    """Where the archive for this Java and this Spark is (or would be); None without java."""
    key = _archive_key()
    return None if key is None else archive_dir() / f"driver-{key}.jsa"


def driver_java_options() -> list[str]:
    """The driver's JVM options for the archive: dump it (in the making process), use it (when
    it exists), or nothing."""
    dump = os.environ.get(DUMP_TO)
    if dump:
        return [f"-XX:ArchiveClassesAtExit={dump}"]
    if os.environ.get(OFF, "").lower() in ("off", "0", "false", "no"):
        return []
    path = archive_path()
    if path is None or not path.is_file():
        return []
    return ["-Xshare:auto", f"-XX:SharedArchiveFile={path}"]


def _workload(home: Path) -> None:
    """A short run of ``clicks_per_user`` and its restore, in this process, then the JVM's
    orderly exit (the dump happens in it)."""
    from pyspark import SparkContext

    from spark_jobs.commands.main import main
    from spark_jobs.sources.generate import generate

    generate(home / "log", "clicks", "clicks", count=4_000, seed=1, users=500)
    run = ["--home", str(home), "run", "clicks_per_user", "--interval-ms", "500"]
    for _ in range(2):  # the first run creates the catalog, the second restores
        code = main([*run, "--max-batches", "2", "--idle-timeout", "2"])
        if code:
            raise SystemExit(f"the workload's run exited {code}")
    gateway = SparkContext._gateway
    if gateway is not None and gateway.proc is not None:
        gateway.proc.stdin.close()  # the gateway exits on EOF: System.exit, then the dump
        gateway.proc.wait(timeout=600)


def build(force: bool = False) -> Path:
    """Make the archive for this Java and this Spark unless it exists (or ``force``): run the
    workload in a child process whose JVM dumps to a temporary file, then move it into place."""
    path = archive_path()
    if path is None:
        raise RuntimeError("no java: no class archive to make")
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory(prefix="cutline-class-archive-") as home:
        env = {**os.environ, DUMP_TO: str(tmp)}
        cmd = [sys.executable, "-m", "spark_jobs.deploy.class_archive", "--workload", home]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise RuntimeError(
            f"making the class archive failed (exit {proc.returncode}):\n"
            + (proc.stdout + proc.stderr)[-3000:]
        )
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_jobs.deploy.class_archive")
    parser.add_argument("--force", action="store_true", help="make it again even if present")
    parser.add_argument("--workload", metavar="HOME", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workload:
        _workload(Path(args.workload))
        return 0
    path = archive_path()
    if path is None:
        print("class archive: no java, nothing to make")
        return 0
    if path.is_file() and not args.force:
        print(f"class archive: {path} (present)")
        return 0
    started = time.monotonic()
    try:
        path = build(force=args.force)
    except RuntimeError as e:  # drivers start without it, only slower
        print(f"class archive: not made, drivers start without it: {e}", file=sys.stderr)
        return 0
    size = path.stat().st_size / 2**20
    print(f"class archive: {path} ({size:.0f} MiB, made in {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
