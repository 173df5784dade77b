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
    LAUNCHER_OPTS,
    archive_path,
    fits_launcher_opts,
    launcher_dump_options,
    superseded_archives,
)


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


def _wanted() -> list[Path]:
    """The archives to have for this Java and this Spark: the driver's, and the launcher's where
    its path can be given to spark-class (no blanks or glob characters)."""
    path, launcher = archive_path(), archive_path("launcher")
    if path is None or launcher is None:
        return []
    return [path] + ([launcher] if fits_launcher_opts(launcher) else [])


def present() -> bool:
    """Every archive wanted exists (none is wanted without java)."""
    return all(p.is_file() for p in _wanted())


def build(force: bool = False) -> Path:
    """Make the archives for this Java and this Spark unless they exist (or ``force``): run the
    workload in a child process whose JVMs dump to temporary files, then move each one made into
    place, and delete those made for an earlier install of this Java and Spark in the same
    place. Returns the driver's archive."""
    wanted = _wanted()
    if not wanted:
        raise RuntimeError("no java: no class archive to make")
    path = wanted[0]
    if present() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmps = {p: p.with_suffix(f".{os.getpid()}.tmp") for p in wanted}
    env = {**os.environ, DUMP_TO: str(tmps[path])}
    if len(wanted) > 1:  # the launcher's: its temporary name fits where its final name does
        env[LAUNCHER_OPTS] = launcher_dump_options(tmps[wanted[1]])
    try:
        with tempfile.TemporaryDirectory(prefix="cutline-class-archive-") as home:
            cmd = [sys.executable, "-m", "spark_jobs.commands.class_archive", "--workload", home]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode == 0:  # each archive made is whole: the JVMs exited in order
            for final, tmp in tmps.items():
                if tmp.is_file():
                    os.replace(tmp, final)
            for old in superseded_archives():  # a JVM mapping one keeps its pages
                old.unlink(missing_ok=True)
        missing = [p.name for p in tmps if not p.is_file()]
        if proc.returncode != 0 or missing:
            raise RuntimeError(
                f"making the class archives failed (exit {proc.returncode}; missing: "
                f"{missing}):\n" + (proc.stdout + proc.stderr)[-3000:]
            )
    finally:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
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
