"""Restoring an attempt's working state, and what it replays before new micro-batches run.

:func:`restore_placed` rebuilds every subtask's RocksDB from a checkpoint, local copy first, in a
Spark job of ``parallelism`` tasks placed on the hosts the executor hints name. A subtask that
finds a file of the primary copy missing, of the wrong size or with the wrong checksum reports it
instead of failing: that is positive evidence against the checkpoint, which
:func:`restore_with_fallback` marks CORRUPT before restoring the next older one.

Replaying committed epochs. A restore from checkpoint *k* whose sinks already committed epochs
after *k*'s (a fallback past damaged checkpoints, or an explicit ``--restore ID``) must not emit
those epochs again. The sinks recorded where each committed epoch ended
(cutline/sinks/delta.py), so the driver replays exactly those micro-batches, from the
same source ranges and in the same order, with their output suppressed: the state (and the
watermark) comes out as it was when the sinks committed them, and the first new micro-batch
continues from there.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from spark_jobs.driver.attempt_start import select_checkpoint
from spark_jobs.driver.evolution import checkpoint_parallelism
from spark_jobs.driver.placement import executor_hosts, placed_rdd, preferred_hosts, wait_for_hosts
from spark_jobs.errors import NoRestorableCheckpointError
from spark_jobs.executor.reports import SubtaskRestoreReport
from spark_jobs.executor.subtask import RunContext, prepare_slot
from state.handles import SubtaskStateHandle
from state.keygroups import KeyGroupRange
from state.manifest import CheckpointManifest, Positions
from state.rescale import overlapping


@dataclass(frozen=True)
class ReplayEpoch:
    """One committed micro-batch to run again silently: its epoch, source ranges and the
    processing time it was planned with."""

    epoch: int
    start: Positions
    end: Positions
    processing_time: int


@dataclass
class Restored:
    """What a restore ended with: the checkpoint actually restored (after fallbacks), the
    subtasks' reports, and the fallbacks taken on the way."""

    manifest: CheckpointManifest | None
    reports: list[SubtaskRestoreReport]
    fallbacks: list[str] = field(default_factory=list)
    seconds: float = 0.0


def restore_placed(
    spark,
    ctx: RunContext,
    manifest: CheckpointManifest | None,
    epoch: int,
    hints: dict[str, str],
    executor_wait_s: float,
    log,
) -> list[SubtaskRestoreReport]:
    """Restore (or, without ``manifest``, empty) every stage's subtasks' working state as of
    ``epoch``; subtask *i* of every stage in one task (slot *i*), on the host its hint names when
    an executor runs there. The subtasks' reports, by subtask, then stage. A task's
    :class:`~spark_jobs.errors.NonRetryableError` (a checkpoint whose key groups the job's
    parallelism does not match) fails the Spark job with text the driver classifies
    (spark_jobs/errors.py)."""
    job = ctx.job
    # a fallback's too: its key groups must be the job's, cut into a whole layout
    was = checkpoint_parallelism(job, manifest) if manifest is not None else None
    rescaled = was is not None and was != job.parallelism
    handles = {
        i: {s.uid: handles_for(manifest, s.uid, i, ctx.key_groups(i)) for s in job.stages}
        for i in range(job.parallelism)
    }
    hints = rescaled_hints(hints, handles)
    sc = spark.sparkContext
    if hints and not sc.master.startswith("local"):
        missing = wait_for_hosts(sc, set(hints.values()), executor_wait_s)
        if missing:
            log(
                f"no executor on hinted hosts {sorted(missing)} after {executor_wait_s} s:"
                " their subtasks restore wherever Spark has room"
            )
    prefs = preferred_hosts(hints, job.parallelism, executor_hosts(sc))
    reports = (
        placed_rdd(sc, prefs)
        .mapPartitionsWithIndex(lambda i, _: prepare_slot(ctx, i, handles[i], epoch))
        .collect()
    )
    order = {s.uid: n for n, s in enumerate(job.stages)}
    reports.sort(key=lambda r: (r.subtask, order[r.stage]))
    return [
        # placed: an executor ran on the hinted host
        replace(
            r,
            hint=hints.get(str(r.subtask)),
            placed=bool(prefs[r.subtask]),
            rescaled_from=tuple(h.subtask for h in handles[r.subtask][r.stage]) if rescaled else (),
        )
        for r in reports
    ]


def handles_for(
    manifest: CheckpointManifest | None, uid: str, subtask: int, key_groups: KeyGroupRange
) -> tuple[SubtaskStateHandle, ...]:
    """What subtask ``subtask`` (owning ``key_groups``) restores stage ``uid`` from: its own
    handle at the checkpoint's parallelism; at another (rescaled), the handles of every old
    subtask whose key groups overlap its own, the largest overlap first; none: it starts empty."""
    if manifest is None:
        return ()
    own = manifest.handle(uid, subtask)
    if own is not None and own.key_group_range == key_groups:
        return (own,)
    old = [h for h in manifest.subtasks if h.operator == uid]
    return tuple(overlapping(old, key_groups)) if old else ()


def rescaled_hints(
    hints: dict[str, str], handles: dict[int, dict[str, tuple[SubtaskStateHandle, ...]]]
) -> dict[str, str]:
    """The hints (host per subtask of the lost attempt) for the subtasks to restore: each goes
    where the subtask it takes most state from ran, whose local copy is there (the same
    subtask, unless rescaled)."""
    out = {}
    for subtask, per_stage in handles.items():
        first = next((h[0] for h in per_stage.values() if h), None)
        host = hints.get(str(first.subtask if first else subtask))
        if host:
            out[str(subtask)] = host
    return out


def replay_epochs(
    manifest: CheckpointManifest,
    through: int,
    ends: dict[int, Positions],
    times: dict[int, int] | None = None,
) -> list[ReplayEpoch]:
    """The micro-batches after ``manifest``'s cut up to epoch ``through``, each from where the
    previous one ended (``ends``: source positions at the end of each epoch), with its planned
    processing time (``times``). An epoch committed by an older Cutline, which did not record
    it, takes the previous epoch's (the checkpoint's trigger time for the first): no partition
    goes idle in it that was not idle before."""
    out, start = [], manifest.source_positions
    clock = manifest.trigger_time_ms
    for epoch in range(manifest.batch_id + 1, through + 1):
        end = {src: {**start.get(src, {}), **parts} for src, parts in ends[epoch].items()}
        clock = (times or {}).get(epoch, clock)
        out.append(ReplayEpoch(epoch, start, end, clock))
        start = end
    return out


def recovery_row(
    job_id: str,
    attempt: int,
    restored: Restored,
    hints: dict[str, str],
    duration_s: float,
) -> dict[str, Any]:
    """The ``recoveries`` catalog row of a restore."""
    reports = restored.reports
    local = [r for r in reports if r.source == "local"]
    return {
        "job_id": job_id,
        "attempt": attempt,
        "checkpoint_id": restored.manifest.checkpoint_id,
        "subtasks_local": len(local),
        "subtasks_remote": len(reports) - len(local),
        "bytes_local": sum(r.bytes_local for r in reports),
        "bytes_remote": sum(r.bytes_remote for r in reports),
        "duration_ms": duration_s * 1000,
        "fallbacks": json.dumps(restored.fallbacks + [f for r in reports for f in r.fallbacks]),
        "hints": json.dumps(hints),
        "recovered_at_ms": int(time.time() * 1000),
        "files_local": sum(r.files_local for r in reports),
        "files_remote": sum(r.files_remote for r in reports),
        "placement": json.dumps(
            [
                {k: getattr(r, k) for k in ("stage", "subtask", "host", "hint", "source")}
                | ({"rescaled_from": list(r.rescaled_from)} if r.rescaled_from else {})
                | ({"joined": r.joined} if r.joined else {})
                for r in reports
            ]
        ),
    }


def restore_with_fallback(
    spark,
    ctx: RunContext,
    catalog,
    storage,
    manifest: CheckpointManifest | None,
    epoch_of,
    *,
    wanted: str | int | None,
    hints: dict[str, str],
    executor_wait_s: float,
    log,
) -> Restored:
    """:func:`restore_placed` from ``manifest``; while a subtask finds positive evidence against
    it, mark it CORRUPT and restore the next older one that validates (only when restoring the
    latest: a named checkpoint that is corrupt is an error). ``epoch_of(manifest)`` is the epoch
    the restored state stands at."""
    started = time.perf_counter()
    job_id, fallbacks = ctx.job.name, []
    while True:
        reports = restore_placed(
            spark, ctx, manifest, epoch_of(manifest), hints, executor_wait_s, log
        )
        corrupt = [r for r in reports if r.corrupt is not None]
        if not corrupt:
            return Restored(manifest, reports, fallbacks, time.perf_counter() - started)
        reason = "; ".join(f"stage {r.stage} subtask {r.subtask}: {r.corrupt}" for r in corrupt[:3])
        log(f"checkpoint {manifest.checkpoint_id} is not restorable, marking it CORRUPT: {reason}")
        catalog.mark_corrupt(job_id, manifest.checkpoint_id, reason)
        fallbacks.append(f"checkpoint {manifest.checkpoint_id}: {reason}")
        if wanted != "latest":
            raise NoRestorableCheckpointError(f"checkpoint {wanted} of {job_id}: {reason}")
        below = manifest.checkpoint_id
        manifest, more = select_checkpoint(catalog, storage, job_id, "latest", log, below=below)
        fallbacks += more
        if manifest is None:
            raise NoRestorableCheckpointError(
                f"{job_id}: no checkpoint can be restored ({' | '.join(fallbacks)}); the run "
                "does not start over from the beginning of its input"
            )
