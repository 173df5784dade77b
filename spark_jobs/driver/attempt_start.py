"""How an attempt starts: what it decides before it needs Spark.

1. Begin the attempt in the catalog: a number no other starter gets, and the fence that stops
   every older attempt from completing a checkpoint (``JobCatalog.begin_attempt``).
2. Fence the job's sinks, so no older attempt commits output to them either.
3. Choose what to start from: the latest completed checkpoint that validates (``latest``), a
   named one, a savepoint (its location: imported as a new checkpoint of the job,
   driver/savepoints.py), or nothing (``none``, an explicit start-over). The rules:

   - the checkpoint root must be the one the checkpoints were written under, and must hold them:
     a wrong root is a :class:`ConfigurationError`, never a reason to mark anything CORRUPT;
   - a checkpoint is marked CORRUPT only on positive evidence: its manifest is there and
     unreadable, or a file it names is missing or has the wrong size (a restore that finds a
     checksum mismatch marks it too, spark_jobs/driver/restore_fallback.py); a missing manifest is
     skipped;
   - a job that has made progress (completed or corrupt checkpoints, output in its sink) never
     starts over silently: when nothing can be restored the start fails
     (:class:`NoRestorableCheckpointError`);
   - an explicit start-over refuses to append to a sink that has output unless told to reset it,
     and retires the old checkpoints so that no later restore goes back to them.

4. Redo the chosen checkpoint's sink commit (a no-op if it landed) and drop what other attempts
   staged.

All of it runs on delta-rs and durable storage, so a driver does it on a thread while its JVM
starts (:func:`plan_start_early`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from cutline.job import JobDefinition
from cutline.sinks import SinkWriter
from spark_jobs.catalog import open_catalog
from spark_jobs.catalog.checkpoint_root import check_root
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.driver.evolution import check_restorable
from spark_jobs.driver.new_history import begin_new_history
from spark_jobs.driver.savepoints import is_location, start_from_savepoint
from spark_jobs.errors import NoRestorableCheckpointError
from state.catalog import CheckpointStatus, FencedError, JobCatalog
from state.config import EXACTLY_ONCE
from state.faults import kill_point
from state.manifest import CheckpointManifest, ManifestError
from state.restore import read_manifest, validate_checkpoint
from state.storage import DurableStorage, MissingFileError, open_storage

START_OVER_HINT = "to start over on purpose: cutline run JOB --restore none (--reset-sink)"


@dataclass(frozen=True)
class StartPlan:
    """What a start decided: its attempt, the checkpoint it restores (validated; ``None``: start
    empty), the fallbacks taken, and the sinks' last committed epoch after the redo."""

    attempt: int
    manifest: CheckpointManifest | None
    fallbacks: list[str] = field(default_factory=list)
    committed_epoch: int = -1
    seconds: float = 0.0  # how long deciding took


def sink_writers(job: JobDefinition, paths: RuntimePaths, attempt: int) -> list[SinkWriter]:
    """The job's sinks (its output, and its dead-letter table if it keeps one) for one attempt;
    the first is the output."""
    return [
        s.writer(job.name, attempt, output=paths.output, staging=paths.staging) for s in job.sinks()
    ]


def plan_start(
    catalog: JobCatalog,
    storage: DurableStorage,
    job: JobDefinition,
    paths: RuntimePaths,
    restore: str | int | None,
    run_id: str = "",
    log=print,
    *,
    reset_sink: bool = False,
    allow_non_restored: bool = False,
) -> StartPlan:
    """Steps 1 to 4 of the module docstring. Needs no Spark session (delta-rs and durable
    storage only)."""
    started = time.monotonic()
    attempt = catalog.begin_attempt(job.name, run_id=run_id, checkpoint_root=paths.checkpoint_root)
    try:
        sinks = sink_writers(job, paths, attempt)
        for sink in sinks:
            sink.fence()
        kill_point("restore-started")
        fallbacks: list[str] = []
        if restore is None:
            start_over(catalog, job, sinks, reset_sink, log)
            manifest = None
        elif is_location(restore):
            check_root(catalog, storage, job.name, paths.checkpoint_root)
            manifest = start_from_savepoint(
                catalog,
                storage,
                job,
                sinks,
                restore,
                attempt,
                log,
                allow_non_restored=allow_non_restored,
                reset_sink=reset_sink,
            )
        else:
            check_root(catalog, storage, job.name, paths.checkpoint_root)
            manifest, fallbacks = select_checkpoint(catalog, storage, job.name, restore, log)
            if manifest is None:
                refuse_silent_start(catalog, job.name, sinks[0], fallbacks)
            else:
                check_restorable(job, manifest, allow_non_restored=allow_non_restored, log=log)
        recover_sinks(job, sinks, manifest, log)
    except BaseException as e:  # the attempt ends here: say so in the catalog
        status = "SUPERSEDED" if isinstance(e, FencedError) else "FAILED"
        try:
            catalog.set_job_status(job.name, attempt, status, f"{type(e).__name__}: {e}")
        except Exception as lost:  # the start's own error is the run's; the sensor sees the row
            log(f"attempt {attempt} not marked {status}: {type(lost).__name__}: {lost}")
        raise
    return StartPlan(
        attempt,
        manifest,
        fallbacks,
        committed_epoch=max(s.committed_epoch() for s in sinks),
        seconds=time.monotonic() - started,
    )


def plan_start_early(
    job: JobDefinition,
    paths: RuntimePaths,
    restore: str | int | None,
    run_id: str = "",
    log=print,
    *,
    reset_sink: bool = False,
    allow_non_restored: bool = False,
) -> Future[StartPlan]:
    """:func:`plan_start` on a thread of its own (the catalog opened, its tables created if
    missing, there too), to overlap the JVM's start."""

    def plan() -> StartPlan:
        return plan_start(
            open_catalog(paths.catalog),
            open_storage(paths.checkpoint_root),
            job,
            paths,
            restore,
            run_id,
            log,
            reset_sink=reset_sink,
            allow_non_restored=allow_non_restored,
        )

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cutline-plan")
    future = pool.submit(plan)
    pool.shutdown(wait=False)
    return future


def abandon_plan(
    plan: Future[StartPlan] | None,
    paths: RuntimePaths,
    job_id: str,
    reason: str,
    log: Callable[[str], None] = print,
) -> None:
    """A start planned early that cannot go on (its Spark session failed): its attempt, if one
    began, is marked FAILED with ``reason``."""
    if plan is None:
        return
    try:
        attempt = plan.result().attempt
    except Exception:  # the plan failed too, and marked its attempt itself
        return
    try:
        open_catalog(paths.catalog).set_job_status(job_id, attempt, "FAILED", reason)
    except Exception as lost:  # the session's error is the run's; the sensor sees the row
        log(f"attempt {attempt} not marked FAILED: {type(lost).__name__}: {lost}")


def select_checkpoint(
    catalog: JobCatalog,
    storage: DurableStorage,
    job_id: str,
    wanted: str | int,
    log=print,
    *,
    below: int | None = None,
) -> tuple[CheckpointManifest | None, list[str]]:
    """The checkpoint to restore: ``latest`` (falling back past ones that do not validate, all
    below ``below`` if given) or an id. Marks CORRUPT only on positive evidence."""
    if wanted == "latest":
        rows = catalog.checkpoints(job_id, (CheckpointStatus.COMPLETED,))
        rows = [r for r in rows if below is None or r.checkpoint_id < below]
    else:
        rows = [r for r in catalog.checkpoints(job_id) if r.checkpoint_id == int(wanted)]
        if not rows:
            raise NoRestorableCheckpointError(f"{job_id} has no checkpoint {wanted}")
    fallbacks: list[str] = []
    for row in sorted(rows, key=lambda r: r.checkpoint_id, reverse=True):
        try:
            manifest = read_manifest(storage, row.metadata_path)
        except MissingFileError:
            reason = f"checkpoint {row.checkpoint_id}: its manifest is missing"
            log(f"{reason}; trying an older one (not marked CORRUPT: no evidence it is)")
            fallbacks.append(reason)
            continue
        except ManifestError as e:
            problems = [str(e)]
        else:
            problems = validate_checkpoint(manifest, storage)
        if not problems:
            return manifest, fallbacks
        reason = "; ".join(problems[:3])
        log(f"checkpoint {row.checkpoint_id} is not restorable, marking it CORRUPT: {reason}")
        catalog.mark_corrupt(job_id, row.checkpoint_id, reason)
        fallbacks.append(f"checkpoint {row.checkpoint_id}: {reason}")
    if wanted != "latest":
        raise NoRestorableCheckpointError(f"checkpoint {wanted} of {job_id}: {fallbacks[-1]}")
    return None, fallbacks


def refuse_silent_start(
    catalog: JobCatalog, job_id: str, sink: SinkWriter, fallbacks: list[str]
) -> None:
    """Nothing to restore: fine for a new job, an error for one that has made progress."""
    made = [
        r.checkpoint_id
        for r in catalog.checkpoints(job_id)
        if r.status in (CheckpointStatus.COMPLETED, CheckpointStatus.CORRUPT)
    ]
    if made:
        why = " | ".join(fallbacks) if fallbacks else "all are marked CORRUPT"
        raise NoRestorableCheckpointError(
            f"{job_id} has checkpoints {made} but none can be restored ({why}); the run does "
            f"not start over from the beginning of its input; {START_OVER_HINT}"
        )
    if sink.has_output():
        raise NoRestorableCheckpointError(
            f"{job_id}'s sink table {sink.table_path} has output but the catalog has no "
            f"checkpoint of it (a wrong warehouse?); {START_OVER_HINT}"
        )


def start_over(
    catalog: JobCatalog, job: JobDefinition, sinks: list[SinkWriter], reset: bool, log
) -> None:
    """An explicit start from empty state (driver/new_history.py)."""
    begin_new_history(
        catalog,
        job.name,
        sinks,
        reset,
        log,
        label="start-over",
        refusal=lambda table: (
            f"--restore none starts {job.name} over, but its sink table {table} already has "
            "output that a start-over would append to again; pass --reset-sink to delete it first"
        ),
    )


def recover_sinks(
    job: JobDefinition, sinks: list[SinkWriter], manifest: CheckpointManifest | None, log
) -> None:
    """Redo the restored checkpoint's sink commits (no-ops if they landed) and drop what other
    attempts staged: it is recomputed."""
    for sink in sinks:
        if manifest is not None and job.checkpoint.mode == EXACTLY_ONCE:
            epoch = manifest.sink_epochs.get(sink.sink, manifest.batch_id)
            ends = {int(e): p for e, p in manifest.epoch_ends.items()}
            redone = sink.commit_through(
                epoch, ends, staged_by=manifest.attempt, times=manifest.epoch_times
            )
            if redone:
                log(f"sink {sink.sink}: epoch {epoch} commit redone ({redone} rows were missing)")
        sink.discard_other_attempts()
    kill_point("sink-recovered")
