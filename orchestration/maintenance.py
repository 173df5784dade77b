"""Jobs that work on the catalog and primary storage in-process, through delta-rs and durable
storage (no Spark session): retention GC, catalog compaction, and recording a stopped job."""

from dagster import (
    AssetMaterialization,
    Config,
    DefaultScheduleStatus,
    MetadataValue,
    OpExecutionContext,
    ScheduleDefinition,
    job,
    op,
)
from pydantic import Field

from orchestration.metadata import mib
from orchestration.resources import CutlinePaths
from spark_jobs.catalog import open_catalog
from spark_jobs.catalog.delta_catalog import DeltaCatalog
from spark_jobs.catalog.upkeep import maintain
from spark_jobs.job_loader import job_names
from spark_jobs.maintenance.compaction import request_compaction
from spark_jobs.maintenance.gc import collect_garbage

RETENTION_INTERVAL_S = 600  # between retention GC passes (retention_schedule)


class StopConfig(Config):
    job_name: str
    run_id: str
    reason: str


@op(description="Records in the catalog that the restart strategy stopped restoring a job")
def record_stopped(
    context: OpExecutionContext,
    config: StopConfig,
    cutline_paths: CutlinePaths,
) -> None:
    catalog = open_catalog(cutline_paths.paths().catalog)
    rows = catalog.jobs(config.job_name)
    # the failed run's attempt, or the newest if its driver died before writing one
    mine = [r for r in rows if r["run_id"] == config.run_id] or rows[-1:]
    if not mine:
        context.log.warning(f"{config.job_name} has no attempt in the catalog to mark")
        return
    row = mine[-1]
    reason = f"restarts stopped: {config.reason}; last failure: {row['failure_reason'] or '?'}"
    catalog.set_job_status(config.job_name, row["attempt"], "STOPPED", reason)
    context.log.info(f"{config.job_name} attempt {row['attempt']} marked STOPPED: {reason}")


@job(description="Marks a streaming job STOPPED in the catalog (restart strategy gave up)")
def stop_streaming_job() -> None:
    record_stopped()


class RetentionConfig(Config):
    jobs: list[str] = Field(
        default_factory=list, description="streaming jobs to collect (default: all that ran)"
    )
    dry_run: bool = Field(default=False, description="report what would go; delete nothing")
    grace_s: float | None = Field(default=None, description="default: the checkpoint timeout")


@op(description="Retention GC of each streaming job: subsume, delete what no checkpoint needs")
def retention_gc(
    context: OpExecutionContext,
    config: RetentionConfig,
    cutline_paths: CutlinePaths,
) -> None:
    reader = cutline_paths.catalog()
    names = config.jobs or [n for n in job_names() if reader.jobs(n)]
    for name in names:
        report = collect_garbage(
            name,
            cutline_paths.paths(),
            dry_run=config.dry_run,
            grace_s=config.grace_s,
            log=context.log.info,
        )
        context.log_event(
            AssetMaterialization(
                asset_key="shared_state_files",
                partition=name,
                description="dry run: nothing deleted" if config.dry_run else "retention GC",
                metadata={
                    "files_deleted": report.files_deleted,
                    "reclaimed_mib": mib(report.bytes_reclaimed),
                    "live_files": report.shared_files_live,
                    "kept_by_grace_files": report.grace_kept_files,
                    "kept_by_grace_mib": mib(report.grace_kept_bytes),
                    "live_mib": mib(report.shared_bytes_live),
                    "stored_mib": mib(report.stored_bytes),
                    "subsumed": MetadataValue.json(report.subsumed),
                    "retained": MetadataValue.json(report.retained),
                    "local_copies_pruned": report.local_copies_pruned,
                    "dry_run": config.dry_run,
                    "duration_ms": report.duration_ms,
                },
            )
        )


@job(description="Refcount-based retention GC of every streaming job's checkpoints")
def retention_job() -> None:
    retention_gc()


class CompactionConfig(Config):
    vacuum_retention_hours: float = Field(
        default=168.0, description="VACUUM keeps files any version of this age needs"
    )


@op(description="OPTIMIZE, VACUUM and a log checkpoint on each catalog table")
def compact_catalog(
    context: OpExecutionContext,
    config: CompactionConfig,
    cutline_paths: CutlinePaths,
) -> None:
    catalog = DeltaCatalog(cutline_paths.paths().catalog)
    counts = maintain(catalog, config.vacuum_retention_hours)
    context.add_output_metadata({f"{t}_files": n for t, n in counts.items()})
    context.log.info(f"catalog tables compacted: data files {counts}")


class StateCompactionConfig(Config):
    jobs: list[str] = Field(
        default_factory=list, description="streaming jobs to measure (default: all that ran)"
    )
    force: bool = Field(default=False, description="request compaction of every subtask")


@op(description="Asks each streaming job whose checkpointed state is a long chain of files to "
    "compact its RocksDB at its next barrier")  # fmt: skip
def request_state_compaction(
    context: OpExecutionContext, config: StateCompactionConfig, cutline_paths: CutlinePaths
) -> None:
    reader = cutline_paths.catalog()
    names = config.jobs or [n for n in job_names() if reader.jobs(n)]
    requested = {}
    for name in names:
        d = request_compaction(name, cutline_paths.paths(), force=config.force)
        if d.requested:
            requested[name] = d.requested
            context.log.info(f"{name}: compaction of subtasks {d.requested} requested ({d.reason})")
        else:
            context.log.info(
                f"{name}: checkpoint {d.latest_checkpoint} within the limits (files per subtask "
                f"{d.files}, from {d.source_checkpoints} checkpoints)"
            )
    context.add_output_metadata({"requested": MetadataValue.json(requested)})


@job(description="Keeps the catalog's Delta tables compact (they grow by a commit per checkpoint) "
     "and bounds the chain of files a restore reads (state compaction requests)")  # fmt: skip
def compaction_job() -> None:
    compact_catalog()
    request_state_compaction()


retention_schedule = ScheduleDefinition(
    name="retention_schedule",
    job=retention_job,
    cron_schedule=f"*/{RETENTION_INTERVAL_S // 60} * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description=f"Retention GC every {RETENTION_INTERVAL_S // 60} minutes",
)
compaction_schedule = ScheduleDefinition(
    name="compaction_schedule",
    job=compaction_job,
    cron_schedule="17 * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Catalog compaction and state compaction requests, hourly",
)
