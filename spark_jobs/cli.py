"""The ``cutline`` command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from state.catalog import CheckpointStatus
from state.manifest import CheckpointManifest, ManifestError
from state.paths import JobLayout
from state.restore import validate_checkpoint
from state.storage import StorageError, open_storage


def default_home() -> Path:
    """``$CUTLINE_HOME``, else ``.cutline`` in the working directory."""
    return Path(os.environ.get("CUTLINE_HOME", ".cutline")).resolve()


def _demo(args: argparse.Namespace) -> int:
    from spark_jobs.local_demo import main_demo

    return main_demo(Path(args.home) / "demo")


def _checkpoints(args: argparse.Namespace) -> int:
    """List a job's checkpoints from their manifests in storage (no catalog needed)."""
    storage = open_storage(args.root)
    layout = JobLayout(args.job)
    ids = sorted(
        {
            cid
            for info in storage.list(args.job)
            if info.path.endswith("/" + JobLayout.METADATA)
            and (cid := JobLayout.checkpoint_id_of(info.path.split("/", 1)[1])) is not None
        }
    )
    if not ids:
        print(f"no checkpoints of job {args.job!r} under {storage.url}")
        return 1
    for cid in ids:
        path = layout.job_path(layout.metadata(cid))
        try:
            m = CheckpointManifest.from_json(storage.get_bytes(path), source=path)
        except (ManifestError, StorageError) as e:
            print(f"chk-{cid}: {CheckpointStatus.CORRUPT.value}: {e}")
            continue
        problems = validate_checkpoint(m, storage) if args.validate else []
        state = "ok" if not problems else f"{len(problems)} problem(s): {problems[0]}"
        print(
            f"chk-{cid}: attempt {m.attempt} batch {m.batch_id} files {m.file_count} "
            f"full {m.full_size:,} B uploaded {m.uploaded_bytes:,} B "
            f"sources {m.source_positions}" + (f" [{state}]" if args.validate else "")
        )
    return 0


def _run(args: argparse.Namespace) -> int:
    from spark_jobs.job import get_job
    from spark_jobs.runtime import RuntimePaths, run_job
    from spark_jobs.session import build_spark

    job = get_job(args.job)
    overrides = {k: v for k, v in (("mode", args.mode), ("interval_ms", args.interval_ms)) if v}
    if overrides:
        job = dataclasses.replace(job, checkpoint=dataclasses.replace(job.checkpoint, **overrides))
    hints = json.loads(Path(args.hints).read_text()) if args.hints else None
    restore = None if args.restore == "none" else args.restore
    spark = build_spark(args.master, f"cutline-{job.name}", kafka=False)
    summary = run_job(
        spark,
        job,
        RuntimePaths.under(Path(args.home)),
        restore=restore,
        hints=hints,
        max_batches=args.max_batches,
        idle_timeout_s=args.idle_timeout,
        run_id=args.run_id,
    )
    print(
        f"{job.name} attempt {summary.attempt}: {summary.batches} micro-batches, "
        f"{summary.records:,} records, checkpoints {summary.checkpoints}, "
        f"positions {summary.positions}"
    )
    return 0


def _generate(args: argparse.Namespace) -> int:
    from spark_jobs.generate import generate
    from spark_jobs.runtime import RuntimePaths

    root = args.log_root or RuntimePaths.under(Path(args.home)).log_root
    n = generate(
        root,
        args.topic or args.kind,
        args.kind,
        count=args.count,
        partitions=args.partitions,
        seed=args.seed,
        users=args.users,
        rate=args.rate,
    )
    print(f"appended {n:,} {args.kind} records to {root}/{args.topic or args.kind}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cutline", description=__doc__)
    parser.add_argument("--home", default=str(default_home()), help="embedded-default home")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the checkpoint/restore demo on the embedded default")
    demo.set_defaults(func=_demo)
    run = sub.add_parser("run", help="run a registered streaming job (one attempt)")
    run.add_argument("job")
    run.add_argument(
        "--restore", default="latest", help="latest (default), a checkpoint id, or none"
    )
    run.add_argument("--hints", help="JSON file: executor hints {subtask: host}")
    run.add_argument("--max-batches", type=int, help="stop after N micro-batches")
    run.add_argument("--idle-timeout", type=float, help="stop after S seconds without new input")
    run.add_argument("--master", help="Spark master (default local[*] or $CUTLINE_SPARK_MASTER)")
    run.add_argument("--mode", choices=["exactly_once", "at_least_once"], help="override")
    run.add_argument("--interval-ms", type=int, help="override the checkpoint interval")
    run.add_argument("--run-id", default="", help="orchestrator run id, recorded in the catalog")
    run.set_defaults(func=_run)
    gen = sub.add_parser("generate", help="append synthetic events to the local log")
    gen.add_argument("kind", choices=["clicks", "orders", "profiles"])
    gen.add_argument("--count", type=int, required=True, help="records per partition")
    gen.add_argument("--topic", help="topic (default: the kind)")
    gen.add_argument("--partitions", type=int, default=2)
    gen.add_argument("--seed", type=int, default=42)
    gen.add_argument("--users", type=int, default=10_000)
    gen.add_argument("--rate", type=float, help="records per second (default: as fast as possible)")
    gen.add_argument("--log-root", help="default: <home>/log")
    gen.set_defaults(func=_generate)
    chk = sub.add_parser("checkpoints", help="list a job's checkpoints from their manifests")
    chk.add_argument("root", help="checkpoint root: a directory, file:// or s3://bucket/prefix")
    chk.add_argument("job")
    chk.add_argument("--validate", action="store_true", help="check every file is present")
    chk.set_defaults(func=_checkpoints)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, StorageError) as e:
        print(f"cutline: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
