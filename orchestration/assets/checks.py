"""Asset checks over every streaming job in the catalog: checkpoints are fresh while a job
runs, no retained checkpoint references a missing file, and primary storage stays bounded; they
run on their own every few minutes (``checks_schedule``). The restore drill restores each job's
latest checkpoint in a sandbox and reads all its state, every hour (``drill_schedule``): the
recovery objective, measured. All run from the UI at any time."""

import time
from collections.abc import Iterable

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetSelection,
    DefaultScheduleStatus,
    MetadataValue,
    ScheduleDefinition,
    asset_check,
    define_asset_job,
)

from orchestration.assets.catalog import completed_checkpoints, shared_state_files
from orchestration.maintenance import RETENTION_INTERVAL_S
from orchestration.metadata import MIB
from orchestration.resources import CutlinePaths, S3Resource
from spark_jobs.job_loader import get_job, job_names
from state.catalog import CheckpointStatus, CompletedCheckpoint
from state.manifest import ManifestError
from state.restore import read_manifest, validate_checkpoint
from state.storage import StorageError

FRESHNESS_INTERVALS = 10  # a running job's latest checkpoint is at most this many intervals old
CHECKS_INTERVAL_MIN = 5


def lawful_garbage_s(grace_s: float, retention_interval_s: float = RETENTION_INTERVAL_S) -> float:
    """How long an upload may stay after no checkpoint needs it: retention deletes only files
    older than the grace period, at passes one interval apart (and one more interval for a pass
    that runs late or takes long)."""
    return grace_s + 2 * retention_interval_s


def storage_bound(
    rows: Iterable[CompletedCheckpoint], num_retained: int, now_ms: int, window_s: float
) -> int | None:
    """What a job's primary storage may hold: ``num_retained + 1`` copies of its largest retained
    checkpoint (the retained ones, and one being written) plus everything uploaded in the last
    ``window_s`` (garbage retention may lawfully not have deleted yet); None with no retained
    checkpoint."""
    rows = list(rows)
    retained = [r for r in rows if r.status == CheckpointStatus.COMPLETED]
    if not retained:
        return None
    recent = sum(r.incremental_size for r in rows if now_ms - r.complete_time_ms < window_s * 1000)
    return (num_retained + 1) * max(r.full_size for r in retained) + recent


def _jobs(cutline_paths: CutlinePaths):
    """(name, attempts) of registered jobs that have run at least once."""
    catalog = cutline_paths.catalog()
    for name in job_names():
        attempts = catalog.jobs(name)
        if attempts:
            yield name, attempts


def _result(problems: dict[str, str], checked: int, **metadata) -> AssetCheckResult:
    return AssetCheckResult(
        passed=not problems,
        severity=AssetCheckSeverity.ERROR,
        metadata={
            "jobs_checked": checked,
            "problems": MetadataValue.json(problems),
            **metadata,
        },
    )


@asset_check(
    asset=completed_checkpoints,
    description=(
        f"While a job runs, its latest completed checkpoint is at most {FRESHNESS_INTERVALS} "
        "checkpoint intervals old (counted from the attempt's start for a new attempt)"
    ),
)
def checkpoint_freshness(cutline_paths: CutlinePaths) -> AssetCheckResult:
    catalog = cutline_paths.catalog()
    now = int(time.time() * 1000)
    problems, ages = {}, {}
    jobs = list(_jobs(cutline_paths))
    for name, attempts in jobs:
        current = attempts[-1]
        if current["status"] != "RUNNING":
            continue
        limit_ms = FRESHNESS_INTERVALS * get_job(name).checkpoint.interval_ms
        done = catalog.checkpoints(name, (CheckpointStatus.COMPLETED,))
        newest = max((c.complete_time_ms for c in done), default=0)
        age_ms = now - max(newest, current["started_ms"])
        ages[name] = round(age_ms / 1000, 1)
        if age_ms > limit_ms:
            problems[name] = (
                f"latest checkpoint {age_ms / 1000:.0f} s old (limit {limit_ms / 1000:.0f} s)"
            )
    return _result(problems, len(jobs), checkpoint_age_s=MetadataValue.json(ages))


@asset_check(
    asset=shared_state_files,
    description="Every file a retained (COMPLETED) checkpoint's manifest names exists, at its size",
)
def no_dangling_references(cutline_paths: CutlinePaths, s3: S3Resource) -> AssetCheckResult:
    catalog, storage = cutline_paths.catalog(), cutline_paths.storage(s3)
    problems, checked_checkpoints = {}, 0
    jobs = list(_jobs(cutline_paths))
    for name, _ in jobs:
        for row in catalog.checkpoints(name, (CheckpointStatus.COMPLETED,)):
            checked_checkpoints += 1
            try:
                found = validate_checkpoint(read_manifest(storage, row.metadata_path), storage)
            except (ManifestError, StorageError) as e:
                found = [str(e)]
            if found:
                problems[f"{name}/chk-{row.checkpoint_id}"] = "; ".join(found[:3])
    return _result(problems, len(jobs), checkpoints_checked=checked_checkpoints)


@asset_check(
    asset=shared_state_files,
    description=(
        "Bytes under a job's root in primary storage stay within (num_retained + 1) x its "
        "largest retained checkpoint plus what it uploaded while retention may lawfully keep "
        "garbage (grace period + two retention intervals)"
    ),
)
def storage_bounded(cutline_paths: CutlinePaths, s3: S3Resource) -> AssetCheckResult:
    catalog, storage = cutline_paths.catalog(), cutline_paths.storage(s3)
    now = int(time.time() * 1000)
    problems, usage = {}, {}
    jobs = list(_jobs(cutline_paths))
    for name, _ in jobs:
        config = get_job(name).checkpoint
        window = lawful_garbage_s(config.timeout_ms / 1000)
        bound = storage_bound(catalog.checkpoints(name), config.num_retained, now, window)
        if bound is None:
            continue
        used = sum(info.size for info in storage.list(name))
        usage[name] = {
            "used_mib": round(used / MIB, 3),
            "bound_mib": round(bound / MIB, 3),
            "window_s": window,
        }
        if used > bound:
            problems[name] = (
                f"{used / MIB:,.1f} MiB in primary storage, bound {bound / MIB:,.1f} MiB"
            )
    return _result(problems, len(jobs), usage=MetadataValue.json(usage))


@asset_check(
    asset=completed_checkpoints,
    description=(
        "Each job's latest completed checkpoint restores in a sandbox (a temporary directory: no "
        "sink commits, nothing the running job uses), every file matching its checksum, and "
        "every state of every stage reads back with the job's definition; records the time"
    ),
)
def restore_drill(cutline_paths: CutlinePaths, s3: S3Resource) -> AssetCheckResult:
    from spark_jobs.commands.state_read import restore_drill as drill

    paths, storage = cutline_paths.paths(), cutline_paths.storage(s3)
    catalog = cutline_paths.catalog()
    problems, drills = {}, {}
    jobs = list(_jobs(cutline_paths))
    for name, _ in jobs:
        done = catalog.checkpoints(name, (CheckpointStatus.COMPLETED,))
        if not done:
            continue
        try:  # the latest completed one, as just read (not looked up in the catalog again)
            report = drill(get_job(name), paths, storage, done[-1].checkpoint_id)
        except (ValueError, StorageError) as e:  # a damaged file, a state in another form
            problems[name] = f"{type(e).__name__}: {e}"
            continue
        drills[name] = {
            "checkpoint_id": report.checkpoint_id,
            "restore_s": report.seconds,
            "mib": round(report.bytes_read / MIB, 3),
            "rows": report.rows,
        }
    slowest = max((d["restore_s"] for d in drills.values()), default=0.0)
    return _result(
        problems, len(jobs), drills=MetadataValue.json(drills), slowest_restore_s=slowest
    )


catalog_checks_job = define_asset_job(
    "catalog_checks",
    selection=AssetSelection.all_asset_checks() - AssetSelection.checks(restore_drill),
    description="Runs the catalog's asset checks (freshness, dangling references, storage)",
)
checks_schedule = ScheduleDefinition(
    name="checks_schedule",
    job=catalog_checks_job,
    cron_schedule=f"*/{CHECKS_INTERVAL_MIN} * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description=f"The asset checks every {CHECKS_INTERVAL_MIN} minutes",
)
restore_drill_job = define_asset_job(
    "restore_drill",
    selection=AssetSelection.checks(restore_drill),
    description="Restores each job's latest checkpoint in a sandbox and reads all its state",
)
drill_schedule = ScheduleDefinition(
    name="drill_schedule",
    job=restore_drill_job,
    cron_schedule="17 * * * *",
    default_status=DefaultScheduleStatus.RUNNING,
    description="The restore drill every hour",
)
