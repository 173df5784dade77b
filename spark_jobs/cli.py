"""The ``cutline`` command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from state.manifest import ManifestError
from state.paths import JobLayout
from state.restore import read_manifest, validate_checkpoint
from state.storage import StorageError, open_storage


def default_home() -> Path:
    """``$CUTLINE_HOME``, else ``.cutline`` in the working directory."""
    return Path(os.environ.get("CUTLINE_HOME", ".cutline")).resolve()


def _core_demo(args: argparse.Namespace) -> int:
    from spark_jobs.local_demo import main_demo

    return main_demo(Path(args.home) / "core-demo")


def _checkpoints(args: argparse.Namespace) -> int:
    """A job's checkpoints from the catalog (read with delta-rs; no Spark)."""
    from spark_jobs.delta_catalog import CatalogReader

    JobLayout(args.job)  # validates the name
    rows = CatalogReader(_paths(args).warehouse).checkpoints(args.job)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=1))
        return 0
    if not rows:
        print(f"no checkpoints of job {args.job!r} in the catalog under {args.home}")
        return 1
    print(
        f"{'id':>5} {'attempt':>7} {'batch':>6} {'status':9} {'full B':>13} {'uploaded B':>13} "
        f"{'files':>5} {'sync ms':>8} {'async ms':>9}"
    )
    for r in rows:
        print(
            f"{r.checkpoint_id:>5} {r.attempt:>7} {r.batch_id:>6} {r.status.value:9} "
            f"{r.full_size:>13,} {r.incremental_size:>13,} {r.file_count:>5} "
            f"{r.sync_ms:>8.1f} {r.async_ms:>9.1f}"
        )
    return 0


def _verify(args: argparse.Namespace) -> int:
    """Check manifests and every file they name (presence, size, checksum)."""
    storage = open_storage(_paths(args).checkpoint_root)
    layout = JobLayout(args.job)
    if args.checkpoint_id is not None:
        ids = [args.checkpoint_id]
    else:
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
    bad = 0
    for cid in ids:
        path = layout.job_path(layout.metadata(cid))
        try:
            m = read_manifest(storage, path)
            problems = validate_checkpoint(m, storage, checksums=True)
        except (ManifestError, StorageError) as e:
            problems = [str(e)]
        bad += bool(problems)
        verdict = "ok" if not problems else f"{len(problems)} problem(s): {problems[0]}"
        print(f"chk-{cid}: {verdict}")
    return 1 if bad else 0


def _demo(args: argparse.Namespace) -> int:
    """The main job on the embedded default: generate clicks, run clicks_per_user to the end."""
    from spark_jobs.generate import generate, records_in

    paths = _paths(args)
    if records_in(paths.log_root, "clicks", 0) == 0:
        generate(paths.log_root, "clicks", "clicks", count=100_000, seed=42)
    args.job, args.restore, args.hints, args.max_batches = "clicks_per_user", "latest", None, None
    args.idle_timeout, args.master, args.run_id, args.mode, args.interval_ms = (
        10.0,
        None,
        "",
        None,
        None,
    )
    rc = _run(args)
    args.json = False
    _checkpoints(args)
    print(f"output: Delta table {paths.warehouse}/tables/clicks_per_user")
    return rc


def _paths(args: argparse.Namespace):
    """The embedded-default paths under ``--home``, with any of them overridden."""
    from spark_jobs.runtime import RuntimePaths

    paths = RuntimePaths.under(Path(args.home))
    overrides = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(paths)
        if getattr(args, f.name, None)
    }
    return dataclasses.replace(paths, **overrides)


def job_for_run(args: argparse.Namespace):
    """The registered job ``args.job`` with the overrides ``cutline run`` was given."""
    from spark_jobs.job import get_job

    job = get_job(args.job)
    overrides = {k: v for k, v in (("mode", args.mode), ("interval_ms", args.interval_ms)) if v}
    if overrides:
        job = dataclasses.replace(job, checkpoint=dataclasses.replace(job.checkpoint, **overrides))
    if args.parallelism:
        job = dataclasses.replace(job, parallelism=args.parallelism)
    if args.max_records_per_partition:
        limit = args.max_records_per_partition
        job = dataclasses.replace(
            job,
            sources=tuple(
                dataclasses.replace(s, max_records_per_partition=limit) for s in job.sources
            ),
        )
    return job


def _run(args: argparse.Namespace) -> int:
    from spark_jobs.events import open_events
    from spark_jobs.job import KafkaSource
    from spark_jobs.runtime import abandon_plan, plan_start_early, run_job
    from spark_jobs.session import build_spark
    from spark_jobs.startup import StartupTimeline

    timeline = StartupTimeline()
    job = job_for_run(args)
    paths = _paths(args)
    hints = json.loads(Path(args.hints).read_text()) if args.hints else None
    restore = None if args.restore == "none" else args.restore
    kafka = any(isinstance(s, KafkaSource) for s in job.sources)
    watch = os.environ.get("CUTLINE_WATCH_PID")
    with open_events() as events:
        # the new attempt and its checkpoint are decided while the JVM starts
        plan = plan_start_early(job, paths, restore, args.run_id, events.log)
        try:
            spark = build_spark(args.master, f"cutline-{job.name}", kafka=kafka)
        except BaseException as e:
            abandon_plan(plan, paths, job.name, f"the Spark session did not start: {e}")
            raise
        timeline.mark("spark session")
        summary = run_job(
            spark,
            job,
            paths,
            plan=plan,
            restore=restore,
            hints=hints,
            max_batches=args.max_batches,
            idle_timeout_s=args.idle_timeout,
            run_id=args.run_id,
            events=events,
            watch_pid=int(watch) if watch else None,
            timeline=timeline,
            **({"executor_wait_s": args.executor_wait_s} if args.executor_wait_s else {}),
        )
        events.emit("finished", {"attempt": summary.attempt, "batches": summary.batches})
    print(
        f"{job.name} attempt {summary.attempt}: {summary.batches} micro-batches, "
        f"{summary.records:,} records, checkpoints {summary.checkpoints}, "
        f"positions {summary.positions}"
    )
    return 0


def _gc(args: argparse.Namespace) -> int:
    """One retention GC pass over a job's checkpoints (see spark_jobs.gc)."""
    from spark_jobs.gc import collect_garbage
    from spark_jobs.session import build_spark

    spark = build_spark(args.master, f"cutline-gc-{args.job}")
    report = collect_garbage(
        spark, args.job, _paths(args), dry_run=args.dry_run, grace_s=args.grace_s
    )
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        verb = "would delete" if args.dry_run else "deleted"
        print(
            f"{args.job}: subsumed {report.subsumed}, retained {report.retained}; {verb} "
            f"{report.files_deleted} files ({report.bytes_reclaimed:,} B); "
            f"{report.stored_bytes:,} B stored; {report.local_copies_pruned} local copies pruned"
        )
    return 0


def _compact(args: argparse.Namespace) -> int:
    """Ask a job to compact its state at its next barrier if its chain of files is too long."""
    from spark_jobs.compaction import request_compaction

    d = request_compaction(
        args.job,
        _paths(args),
        force=args.force,
        max_files=args.max_files,
        max_checkpoints=args.max_checkpoints,
        dry_run=args.dry_run,
    )
    if args.json:
        print(json.dumps(d.to_dict()))
    elif d.latest_checkpoint is None:
        print(f"{args.job}: no completed checkpoint to measure")
    else:
        verb = "would request" if args.dry_run else "requested"
        print(
            f"{args.job}: checkpoint {d.latest_checkpoint} references files per subtask "
            f"{d.files}, uploaded by {d.source_checkpoints} checkpoints; "
            + (
                f"{verb} compaction of subtasks {d.requested} ({d.reason})"
                if d.requested
                else "within the limits, nothing requested"
            )
        )
    return 0


def _generate(args: argparse.Namespace) -> int:
    from spark_jobs.generate import generate

    root = _paths(args).log_root
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


def _add_path_options(parser: argparse.ArgumentParser) -> None:
    for name, default in (
        ("checkpoint-root", "<home>/checkpoints; or s3://bucket/prefix"),
        ("warehouse", "<home>/warehouse"),
        ("local-state-root", "<home>/local-state"),
        ("log-root", "<home>/log"),
    ):
        parser.add_argument(f"--{name}", help=f"default: {default}")


def build_parser() -> argparse.ArgumentParser:
    from spark_jobs.generate import KINDS

    parser = argparse.ArgumentParser(prog="cutline", description=__doc__)
    parser.add_argument("--home", default=str(default_home()), help="embedded-default home")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the main job (clicks_per_user) on the embedded default")
    demo.set_defaults(func=_demo)
    core = sub.add_parser("core-demo", help="checkpoint, crash and restore with state/ alone")
    core.set_defaults(func=_core_demo)
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
    run.add_argument(
        "--max-records-per-partition",
        type=int,
        help="override every source's admission limit per partition and micro-batch",
    )
    run.add_argument(
        "--parallelism", type=int, help="override (a restore needs the checkpoint's parallelism)"
    )
    run.add_argument(
        "--executor-wait-s",
        type=float,
        help="how long a restore on a cluster waits for executors on the hinted hosts (60)",
    )
    run.add_argument("--run-id", default="", help="orchestrator run id, recorded in the catalog")
    _add_path_options(run)
    run.set_defaults(func=_run)
    gc = sub.add_parser("gc", help="retention GC of a job: subsume, delete what nothing needs")
    gc.add_argument("job")
    gc.add_argument("--dry-run", action="store_true", help="report what would go; delete nothing")
    gc.add_argument("--grace-s", type=float, help="default: the job's checkpoint timeout")
    gc.add_argument("--master", help="Spark master (default local[*] or $CUTLINE_SPARK_MASTER)")
    gc.add_argument("--json", action="store_true")
    _add_path_options(gc)
    gc.set_defaults(func=_gc)
    comp = sub.add_parser(
        "compact", help="ask a job to compact its RocksDB state at its next barrier"
    )
    comp.add_argument("job")
    comp.add_argument("--force", action="store_true", help="every subtask, whatever its chain")
    comp.add_argument("--max-files", type=int, help="default: checkpoint.compaction_max_files")
    comp.add_argument(
        "--max-checkpoints", type=int, help="default: checkpoint.compaction_max_checkpoints"
    )
    comp.add_argument("--dry-run", action="store_true", help="measure; request nothing")
    comp.add_argument("--json", action="store_true")
    _add_path_options(comp)
    comp.set_defaults(func=_compact)
    gen = sub.add_parser("generate", help="append synthetic events to the local log")
    gen.add_argument("kind", choices=KINDS)
    gen.add_argument("--count", type=int, required=True, help="records per partition")
    gen.add_argument("--topic", help="topic (default: the kind)")
    gen.add_argument("--partitions", type=int, default=2)
    gen.add_argument("--seed", type=int, default=42)
    gen.add_argument("--users", type=int, default=10_000)
    gen.add_argument("--rate", type=float, help="records per second (default: as fast as possible)")
    gen.add_argument("--log-root", help="default: <home>/log")
    gen.set_defaults(func=_generate)
    chk = sub.add_parser("checkpoints", help="a job's checkpoints, from the catalog")
    chk.add_argument("job")
    chk.add_argument("--json", action="store_true")
    chk.set_defaults(func=_checkpoints)
    ver = sub.add_parser("verify", help="verify manifests and the files they name (checksums)")
    ver.add_argument("job")
    ver.add_argument("checkpoint_id", nargs="?", type=int)
    ver.add_argument("--checkpoint-root", help="default: <home>/checkpoints; or s3://bucket/prefix")
    ver.set_defaults(func=_verify)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, StorageError) as e:  # bad input or configuration
        print(f"cutline: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a failed run (the catalog records why), or no Java
        print(f"cutline: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
