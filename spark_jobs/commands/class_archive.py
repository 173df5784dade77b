"""Making the JVMs' class-data archives (spark_jobs/deploy/class_archive.py says where they are
and how drivers use them): a child process runs a short ``clicks_per_user`` and its restore
through the ``cutline`` command; its driver JVM dumps the classes they loaded when it exits, and
Spark's launcher JVM, run before it, the classes the launcher loaded.

    python -m spark_jobs.commands.class_archive [--force]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spark_jobs.deploy.class_archive import (
    DUMP_TO,
    archive_path,
    launcher_archive_path,
    launcher_dump_options,
)
from spark_jobs.deploy.python_env import LAUNCHER_OPTS


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


def present() -> bool:
    """Both archives for this Java and this Spark exist."""
    paths = (archive_path(), launcher_archive_path())
    return all(p is not None and p.is_file() for p in paths)


def build(force: bool = False) -> Path:
    """Make the archives for this Java and this Spark unless both exist (or ``force``): run the
    workload in a child process whose JVMs dump to temporary files, then move them into place.
    Returns the driver's archive."""
    path, launcher = archive_path(), launcher_archive_path()
    if path is None or launcher is None:
        raise RuntimeError("no java: no class archive to make")
    if present() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, launcher_tmp = (p.with_suffix(f".{os.getpid()}.tmp") for p in (path, launcher))
    with tempfile.TemporaryDirectory(prefix="cutline-class-archive-") as home:
        env = {**os.environ, DUMP_TO: str(tmp), LAUNCHER_OPTS: launcher_dump_options(launcher_tmp)}
        cmd = [sys.executable, "-m", "spark_jobs.commands.class_archive", "--workload", home]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not tmp.is_file() or not launcher_tmp.is_file():
        tmp.unlink(missing_ok=True)
        launcher_tmp.unlink(missing_ok=True)
        raise RuntimeError(
            f"making the class archives failed (exit {proc.returncode}):\n"
            + (proc.stdout + proc.stderr)[-3000:]
        )
    os.replace(launcher_tmp, launcher)
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_jobs.commands.class_archive")
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
    if present() and not args.force:
        print(f"class archive: {path} (present)")
        return 0
    print(
        "class archive: making the driver's and the launcher's JVM class archives, once for "
        "this Java and Spark (a short job runs and restores; a minute or two): later drivers "
        "start faster",
        flush=True,
    )
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
