"""What the ``cutline`` subcommands do (spark_jobs/commands/parser.py parses the command line): each
takes its job as ``run`` does, a registered name or ``module:attr``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs.errors import ConfigurationError

if TYPE_CHECKING:
    from cutline.job import JobDefinition
    from spark_jobs.deploy.settings import RuntimePaths, Settings


def deployment_settings(args: argparse.Namespace) -> Settings:
    """The deployment's settings (spark_jobs/deploy/settings.py); ``--home`` puts every path that no
    flag names under that home."""
    from spark_jobs.deploy.settings import load_settings

    settings = load_settings()
    return settings.at_home(args.home) if args.home else settings


def core_demo(args: argparse.Namespace) -> int:
    from spark_jobs.commands.local_demo import main_demo

    return main_demo(Path(deployment_settings(args).home) / "core-demo")


def checkpoints(args: argparse.Namespace) -> int:
    from spark_jobs.commands.checkpoint_listing import list_checkpoints

    paths = runtime_paths(args)
    return list_checkpoints(recorded_job(args.job, paths), paths.catalog, as_json=args.json)


def verify(args: argparse.Namespace) -> int:
    from spark_jobs.commands.checkpoint_listing import verify_checkpoints

    paths = runtime_paths(args)
    job = recorded_job(args.job, paths, stored_under=paths.checkpoint_root)
    return verify_checkpoints(job, paths.checkpoint_root, args.checkpoint_id)


def recorded_job(ref: str, paths: RuntimePaths, stored_under: str | None = None) -> str:
    """The job name a read-only command is about: a registered job's, ``module:attr``'s, a job
    the catalog has rows of (installed or not), or one with files under ``stored_under`` (a
    checkpoint root: ``verify`` reads storage alone); anything else is refused with the close
    matches (exit 2)."""
    from spark_jobs.catalog.tables import CatalogReader
    from spark_jobs.job_loader import job_name_of
    from state.paths import JobLayout
    from state.storage import open_storage

    if ".." in ref.split("/"):  # a path out of the roots is refused as one, whatever else
        JobLayout(ref)

    def recorded() -> list[str]:
        known = CatalogReader(paths.catalog).job_ids()
        stored = stored_under is not None and ":" not in ref and "/" not in ref
        if stored and next(iter(open_storage(stored_under).list(ref)), None) is not None:
            known.append(ref)
        return known

    return job_name_of(ref, recorded)


def state_read(args: argparse.Namespace) -> int:
    from spark_jobs.commands.state_read import state_read
    from spark_jobs.job_loader import get_job

    return state_read(args, get_job(args.job), runtime_paths(args))


def savepoint(args: argparse.Namespace) -> int:
    from spark_jobs.commands.savepoints import dispose_savepoint, take_savepoint

    paths = runtime_paths(args)
    if args.dispose:
        deleted = dispose_savepoint(args.job, paths, args.dispose)
        print(f"savepoint {args.dispose} deleted ({deleted} files)")
        return 0
    row = take_savepoint(
        args.job, paths, target=args.target or "", stop=args.stop, timeout_s=args.timeout
    )
    if args.json:
        print(json.dumps(row))
    else:
        print(
            f"savepoint {row['location']}: checkpoint {row['checkpoint_id']} (batch "
            f"{row['batch_id']}), {row['size']:,} B in {row['file_count']} files"
            + (", the job stopped" if row["stopped"] else "")
        )
    return 0


def savepoints(args: argparse.Namespace) -> int:
    from spark_jobs.commands.savepoints import list_savepoints

    return list_savepoints(args.job, runtime_paths(args), as_json=args.json)


def demo(args: argparse.Namespace) -> int:
    """The main job on the embedded default: generate clicks, run clicks_per_user to the end."""
    from spark_jobs.commands.parser import build_parser
    from spark_jobs.sources.generate import generate, records_in
    from state.storage.tables import table_uri

    paths = runtime_paths(args)
    if records_in(paths.log_root, "clicks", 0) == 0:
        generate(paths.log_root, "clicks", "clicks", count=100_000, seed=42)
    home = ["--home", args.home] if args.home else []
    verbose = ["--verbose"] if args.verbose else []
    run_args = build_parser().parse_args(
        [*home, *verbose, "run", "clicks_per_user", "--idle-timeout", "10"]
    )
    rc = run(run_args)
    args.json = False
    checkpoints(args)
    print(f"output: Delta table {table_uri(paths.output, 'clicks_per_user')}")
    return rc


def config(args: argparse.Namespace) -> int:
    """``cutline config``: this process's effective settings, each with where it came from,
    secrets masked (state/redaction.py)."""
    from spark_jobs.deploy.settings import RuntimePaths, explain_settings
    from state.redaction import redact

    names = ["home", *(f.name for f in dataclasses.fields(RuntimePaths))]
    flags = {name: getattr(args, name, None) for name in names}
    settings = explain_settings(flags)
    if args.json:
        rows = [{"name": s.name, "value": s.value, "source": s.source} for s in settings]
        print(redact(json.dumps(rows, indent=2)))
        return 0
    width = max(len(s.name) for s in settings)
    for s in settings:
        print(redact(f"{s.name:<{width}}  {s.value or '-'}  ({s.source})"))
    print("credentials: never settings; boto3's and Hadoop's standard chains find them")
    return 0


def runtime_paths(args: argparse.Namespace) -> RuntimePaths:
    """The settings' paths, with any of them overridden by a flag."""
    paths = deployment_settings(args).paths()
    overrides = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(paths)
        if getattr(args, f.name, None)
    }
    return dataclasses.replace(paths, **overrides)


def job_for_run(args: argparse.Namespace) -> JobDefinition:
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


def run(args: argparse.Namespace) -> int:
    from cutline.sources.log import with_log_root
    from spark_jobs.catalog.tables import CatalogReader
    from spark_jobs.deploy.session import build_spark, stop_spark
    from spark_jobs.deploy.settings import check_roles
    from spark_jobs.driver.attempt_start import abandon_plan, plan_start_early
    from spark_jobs.driver.placement import executor_hosts
    from spark_jobs.driver.run import run_job
    from spark_jobs.driver.savepoints import check_savepoint, is_location
    from spark_jobs.driver.standby import TAKEOVERS, Supervisor, driver_command, stand_by
    from spark_jobs.driver.startup_phases import StartupTimeline
    from spark_jobs.driver.warm_up import warm_up_query, warm_up_workers
    from spark_jobs.events import open_events
    from spark_jobs.job_loader import ship_user_code

    timeline = StartupTimeline()
    job = job_for_run(args)
    ship_user_code(job)
    paths = runtime_paths(args)
    hints = json.loads(Path(args.hints).read_text()) if args.hints else None
    restore = None if args.restore == "none" else args.restore
    reset_sink = args.reset_sink
    if args.as_standby:  # a takeover restores the latest, whatever the first driver began with
        restore, reset_sink = "latest", False
    if args.takeovers and not args.standby:
        raise ConfigurationError("--takeovers counts a supervisor's takeovers: it needs --standby")
    if reset_sink and restore is not None and not is_location(restore):
        raise ConfigurationError(
            "--reset-sink only goes with --restore none (a start-over) or a savepoint's location"
        )
    if restore is not None and is_location(restore):  # refused before anything is created
        check_savepoint(job, restore, allow_non_restored=args.allow_non_restored_state)
    check_roles(paths)  # a missing bucket or denied access: exit 2 before any JVM starts
    watch = os.environ.get("CUTLINE_WATCH_PID")
    master = args.master or deployment_settings(args).spark_master
    with open_events() as events:
        if args.standby:  # a supervisor of an active driver and a standby (no JVM here)
            watched = int(watch) if watch else None
            takeovers = args.takeovers or TAKEOVERS
            command = driver_command(args.argv)
            return Supervisor(command, events, takeovers, watch_pid=watched).run()

        def session():
            return build_spark(
                master,
                f"cutline-{job.name}",
                needs=job.spark_dependencies(),
                extra=dict(args.conf),
                quiet=not args.verbose,
            )

        events.emit("driver", {"pid": os.getpid(), "standby": args.as_standby})
        if args.as_standby:  # warm first; the attempt begins only at the takeover
            spark = session()

            def warm() -> None:  # on a cluster, only while it has executors (their workers)
                if executor_hosts(spark.sparkContext):
                    warm_up_workers(spark, job.parallelism, timeline, events.log)

            warm()
            if executor_hosts(spark.sparkContext):
                warm_up_query(spark, with_log_root(job, paths.log_root), events.log)
            if not stand_by(events.log, warm):
                stop_spark(spark)
                return 0
            timeline = StartupTimeline(time.monotonic(), "the takeover's order")
            if not spark.sparkContext.master.startswith("local"):  # each subtask where its copy is
                hints = CatalogReader(paths.catalog).allocation(job.name, args.run_id) or hints
        # the new attempt and its checkpoint are decided while the JVM starts
        plan = plan_start_early(
            job,
            paths,
            restore,
            args.run_id,
            events.log,
            reset_sink=reset_sink,
            allow_non_restored=args.allow_non_restored_state,
        )
        if not args.as_standby:
            try:
                spark = session()
            except BaseException as e:
                reason = f"the Spark session did not start: {e}"
                abandon_plan(plan, paths, job.name, reason, events.log)
                raise
            timeline.mark("spark session")
        try:
            summary = run_job(
                spark,
                job,
                paths,
                plan=plan,
                restore=restore,
                reset_sink=reset_sink,
                allow_non_restored=args.allow_non_restored_state,
                hints=hints,
                max_batches=args.max_batches,
                idle_timeout_s=args.idle_timeout,
                until_caught_up=args.until_caught_up,
                run_id=args.run_id,
                events=events,
                watch_pid=int(watch) if watch else None,
                timeline=timeline,
                workers_warm=args.as_standby,
                **({"executor_wait_s": args.executor_wait_s} if args.executor_wait_s else {}),
            )
        finally:
            stop_spark(spark)  # Spark's threads log nothing after the run's last line
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


def _quiet(line: str) -> None:
    pass


def gc(args: argparse.Namespace) -> int:
    """One retention GC pass over a job's checkpoints (see spark_jobs.maintenance.gc)."""
    from spark_jobs.maintenance.gc import collect_garbage

    report = collect_garbage(  # its summary below says what the pass's own log line says
        args.job, runtime_paths(args), dry_run=args.dry_run, grace_s=args.grace_s, log=_quiet
    )
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        verb = "would delete" if args.dry_run else "deleted"
        print(
            f"{report.job}: subsumed {report.subsumed}, retained {report.retained}; {verb} "
            f"{report.files_deleted} files ({report.bytes_reclaimed:,} B); "
            f"{report.stored_bytes:,} B stored; {report.local_copies_pruned} local copies pruned"
        )
        if report.grace_kept_files:
            until = time.strftime("%H:%M:%S UTC", time.gmtime(report.grace_until_ms / 1000))
            print(
                f"{report.job}: the grace period ({report.grace_s:g} s, --grace-s) keeps "
                f"{report.grace_kept_files} more files ({report.grace_kept_bytes:,} B) that no "
                f"retained checkpoint references; a pass after {until} deletes them"
            )
    return 0


def compact(args: argparse.Namespace) -> int:
    """Ask a job to compact its state at its next barrier if its chain of files is too long."""
    from spark_jobs.maintenance.compaction import request_compaction

    d = request_compaction(
        args.job,
        runtime_paths(args),
        force=args.force,
        max_files=args.max_files,
        max_checkpoints=args.max_checkpoints,
        dry_run=args.dry_run,
    )
    if args.json:
        print(json.dumps(d.to_dict()))
    elif d.latest_checkpoint is None:
        print(f"{d.job}: no completed checkpoint to measure")
    else:
        verb = "would request" if args.dry_run else "requested"
        print(
            f"{d.job}: checkpoint {d.latest_checkpoint} references files per subtask "
            f"{d.files}, uploaded by {d.source_checkpoints} checkpoints; "
            + (
                f"{verb} compaction of subtasks {d.requested} ({d.reason})"
                if d.requested
                else "within the limits, nothing requested"
            )
        )
    return 0


def generate(args: argparse.Namespace) -> int:
    from spark_jobs.sources.generate import generate

    root = runtime_paths(args).log_root
    n = generate(
        root,
        args.topic or args.kind,
        args.kind,
        count=args.count,
        partitions=args.partitions,
        total=not args.per_partition,
        seed=args.seed,
        users=args.users,
        rate=args.rate,
        fmt=args.format,
    )
    print(f"appended {n:,} {args.kind} records to {root}/{args.topic or args.kind}")
    return 0
