"""The ``cutline`` command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from spark_jobs.errors import ConfigurationError
from state.storage import StorageError


def _settings(args: argparse.Namespace):
    """The deployment's settings (spark_jobs/settings.py); ``--home`` puts every path that no
    flag names under that home."""
    from spark_jobs.settings import load_settings

    settings = load_settings()
    return settings.at_home(args.home) if args.home else settings


def _core_demo(args: argparse.Namespace) -> int:
    from spark_jobs.local_demo import main_demo

    return main_demo(Path(_settings(args).home) / "core-demo")


def _checkpoints(args: argparse.Namespace) -> int:
    from spark_jobs.checkpoint_listing import list_checkpoints

    return list_checkpoints(args.job, _paths(args).warehouse, as_json=args.json)


def _verify(args: argparse.Namespace) -> int:
    from spark_jobs.checkpoint_listing import verify_checkpoints

    return verify_checkpoints(args.job, _paths(args).checkpoint_root, args.checkpoint_id)


def _demo(args: argparse.Namespace) -> int:
    """The main job on the embedded default: generate clicks, run clicks_per_user to the end."""
    from spark_jobs.sources.generate import generate, records_in

    paths = _paths(args)
    if records_in(paths.log_root, "clicks", 0) == 0:
        generate(paths.log_root, "clicks", "clicks", count=100_000, seed=42)
    home = ["--home", args.home] if args.home else []
    run_args = build_parser().parse_args([*home, "run", "clicks_per_user", "--idle-timeout", "10"])
    rc = _run(run_args)
    args.json = False
    _checkpoints(args)
    print(f"output: Delta table {paths.warehouse}/tables/clicks_per_user")
    return rc


def _paths(args: argparse.Namespace):
    """The settings' paths, with any of them overridden by a flag."""
    paths = _settings(args).paths()
    overrides = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(paths)
        if getattr(args, f.name, None)
    }
    return dataclasses.replace(paths, **overrides)


def job_for_run(args: argparse.Namespace):
    """The job ``args.job`` (spark_jobs/job_loader.py) with the overrides ``cutline run`` was
    given."""
    from spark_jobs.job_loader import get_job

    job = get_job(args.job)
    checkpoint = {
        k: v for k, v in (("mode", args.mode), ("interval_ms", args.interval_ms)) if v is not None
    }
    if checkpoint:
        job = dataclasses.replace(job, checkpoint=dataclasses.replace(job.checkpoint, **checkpoint))
    if args.parallelism is not None:
        job = dataclasses.replace(job, parallelism=args.parallelism)
    if args.bad_records is not None:
        job = dataclasses.replace(job, bad_records=args.bad_records)
    if args.max_records_per_partition is not None:
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
    from spark_jobs.job_loader import ship_user_code
    from spark_jobs.runtime.run import run_job
    from spark_jobs.runtime.start import abandon_plan, plan_start_early
    from spark_jobs.runtime.startup import StartupTimeline
    from spark_jobs.session import build_spark

    timeline = StartupTimeline()
    job = job_for_run(args)
    ship_user_code(job)
    paths = _paths(args)
    hints = json.loads(Path(args.hints).read_text()) if args.hints else None
    restore = None if args.restore == "none" else args.restore
    if args.reset_sink and restore is not None:
        raise ConfigurationError("--reset-sink only goes with --restore none (a start-over)")
    kafka = any(s.needs_kafka_connector for s in job.sources)
    watch = os.environ.get("CUTLINE_WATCH_PID")
    master = args.master or _settings(args).spark_master
    with open_events() as events:
        events.emit("driver", {"pid": os.getpid()})
        # the new attempt and its checkpoint are decided while the JVM starts
        plan = plan_start_early(
            job,
            paths,
            restore,
            args.run_id,
            events.log,
            reset_sink=args.reset_sink,
            allow_non_restored=args.allow_non_restored_state,
        )
        try:
            spark = build_spark(master, f"cutline-{job.name}", kafka=kafka)
        except BaseException as e:
            abandon_plan(plan, paths, job.name, f"the Spark session did not start: {e}")
            raise
        timeline.mark("spark session")
        try:
            summary = run_job(
                spark,
                job,
                paths,
                plan=plan,
                restore=restore,
                reset_sink=args.reset_sink,
                allow_non_restored=args.allow_non_restored_state,
                hints=hints,
                max_batches=args.max_batches,
                idle_timeout_s=args.idle_timeout,
                run_id=args.run_id,
                events=events,
                watch_pid=int(watch) if watch else None,
                timeline=timeline,
                **({"executor_wait_s": args.executor_wait_s} if args.executor_wait_s else {}),
            )
        finally:
            spark.stop()  # Spark's threads log nothing after the run's last line
        events.emit("finished", {"attempt": summary.attempt, "batches": summary.batches})
    print(
        f"{job.name} attempt {summary.attempt}: {summary.batches} micro-batches, "
        f"{summary.records:,} records, checkpoints {summary.checkpoints}, "
        f"positions {summary.positions}"
        + (f", {summary.bad_records} bad records dead-lettered" if summary.bad_records else "")
        + (
            f", {summary.replayed_epochs} committed epochs replayed"
            if summary.replayed_epochs
            else ""
        )
    )
    return 0


def _gc(args: argparse.Namespace) -> int:
    """One retention GC pass over a job's checkpoints (see spark_jobs.maintenance.gc)."""
    from spark_jobs.maintenance.gc import collect_garbage
    from spark_jobs.session import build_spark

    spark = build_spark(args.master or _settings(args).spark_master, f"cutline-gc-{args.job}")
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
    from spark_jobs.maintenance.compaction import request_compaction

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
    from spark_jobs.sources.generate import generate

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


def _positive(kind):
    """An argparse type: a number of ``kind`` above zero (zero and negatives are refused, not
    ignored)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def _restore_choice(text: str) -> str:
    if text in ("latest", "none") or (text.isdigit() and int(text) > 0):
        return text
    raise argparse.ArgumentTypeError(f"latest, none or a checkpoint id, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    from spark_jobs.job import BAD_RECORD_POLICIES
    from spark_jobs.sources.generate import KINDS

    parser = argparse.ArgumentParser(prog="cutline", description=__doc__)
    parser.add_argument(
        "--home",
        help="put every path no flag names under this directory "
        "(default: the settings, $CUTLINE_HOME or ./.cutline)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the main job (clicks_per_user) on the embedded default")
    demo.set_defaults(func=_demo)
    core = sub.add_parser("core-demo", help="checkpoint, crash and restore with state/ alone")
    core.set_defaults(func=_core_demo)
    run = sub.add_parser("run", help="run a registered streaming job (one attempt)")
    run.add_argument(
        "job", help="a job's name (registered or installed), or module:attribute of your own"
    )
    run.add_argument(
        "--restore",
        default="latest",
        type=_restore_choice,
        help="latest (default), a checkpoint id, or none (start over on purpose)",
    )
    run.add_argument(
        "--reset-sink",
        action="store_true",
        help="with --restore none: delete the output a start-over would append to again",
    )
    run.add_argument(
        "--allow-non-restored-state",
        action="store_true",
        help="restore even if the checkpoint holds state of a stage the job no longer has "
        "(that state is dropped)",
    )
    run.add_argument("--hints", help="JSON file: executor hints {subtask: host}")
    run.add_argument("--max-batches", type=_positive(int), help="stop after N micro-batches")
    run.add_argument(
        "--idle-timeout", type=_positive(float), help="stop after S seconds without new input"
    )
    run.add_argument("--master", help="Spark master (default: the settings, or local[*])")
    run.add_argument("--mode", choices=["exactly_once", "at_least_once"], help="override")
    run.add_argument("--interval-ms", type=_positive(int), help="override the checkpoint interval")
    run.add_argument(
        "--max-records-per-partition",
        type=_positive(int),
        help="override every source's admission limit per partition and micro-batch",
    )
    run.add_argument(
        "--parallelism",
        type=_positive(int),
        help="override (a restore needs the checkpoint's parallelism)",
    )
    run.add_argument(
        "--bad-records",
        choices=BAD_RECORD_POLICIES,
        help="override: fail on a bad record (exit 2), or skip it into the dead-letter table",
    )
    run.add_argument(
        "--executor-wait-s",
        type=_positive(float),
        help="how long a restore on a cluster waits for executors on the hinted hosts (60)",
    )
    run.add_argument("--run-id", default="", help="orchestrator run id, recorded in the catalog")
    _add_path_options(run)
    run.set_defaults(func=_run)
    gc = sub.add_parser("gc", help="retention GC of a job: subsume, delete what nothing needs")
    gc.add_argument("job")
    gc.add_argument("--dry-run", action="store_true", help="report what would go; delete nothing")
    gc.add_argument("--grace-s", type=float, help="default: the job's checkpoint timeout")
    gc.add_argument("--master", help="Spark master (default: the settings, or local[*])")
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
    """Run a command; the exit code says what an orchestrator should do (spark_jobs/errors.py):
    1 failed (restore it), 2 bad input or configuration (do not), 3 superseded (do not)."""
    from spark_jobs.errors import exit_code
    from state.faults import arm

    arm()  # crash tests' kill points (state/faults.py); nothing without CUTLINE_FAULT_KILL
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (Exception, KeyboardInterrupt) as e:
        if isinstance(e, KeyboardInterrupt):
            return 130
        code = exit_code(e)
        if code == 1 and not isinstance(e, RuntimeError | StorageError):
            raise  # a bug, not an outcome: keep its traceback
        lines = str(e).strip().splitlines() or [type(e).__name__]
        more = " (the log above has the rest)" if len(lines) > 1 else ""
        print(f"cutline: {lines[0]}{more}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
