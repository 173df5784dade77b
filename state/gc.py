"""Retention GC of one job, planned as a pure function of the catalog, the manifests and a
listing of primary storage (docs/design.md §9; the rules are in :mod:`state.registry`).

The plan never deletes a file that a retained checkpoint, a recently subsumed checkpoint (a
pending checkpoint may still build on it), the checkpoint the current attempt restored from, or a
pending checkpoint needs. It is idempotent: running it again on what a killed run left behind
deletes the rest and nothing more, because it is recomputed from what is stored each time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from state.acks import ACKS_DIR
from state.catalog import CheckpointStatus, CompletedCheckpoint
from state.compaction import REQUESTS_DIR
from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.registry import StoredFile, deletable, refcounts, select_subsumed

CONTROL_DIRS = (ACKS_DIR, REQUESTS_DIR)  # what a running job reads, not checkpoint data


@dataclass(frozen=True)
class Retention:
    """Which checkpoints stay: ``retained`` are COMPLETED after this pass; ``protected`` are the
    checkpoints whose files must be kept (retained, recently subsumed, restored-from)."""

    subsume: list[int]
    retained: list[int]
    protected: list[int]


@dataclass(frozen=True)
class GcPlan:
    """The files one GC pass deletes, and the registry's view of the shared files."""

    delete: list[StoredFile]
    refcounts: dict[str, int] = field(default_factory=dict)  # shared path -> retained references
    last_used: dict[str, int] = field(default_factory=dict)  # shared path -> newest referencing id

    @property
    def bytes_reclaimed(self) -> int:
        return sum(f.size for f in self.delete)


def select_retention(
    checkpoints: Iterable[CompletedCheckpoint],
    *,
    num_retained: int,
    now_ms: int,
    grace_s: float,
    restored_from: int | None = None,
    restored_done: bool = True,
) -> Retention:
    """Subsume COMPLETED checkpoints beyond ``num_retained`` (never the latest, never a
    savepoint) and name the checkpoints whose files stay. ``restored_from``/``restored_done``:
    the checkpoint the current attempt restored, and whether a later one completed since (until
    then its files stay)."""
    rows = sorted(checkpoints, key=lambda c: c.checkpoint_id)
    completed = [c for c in rows if c.status == CheckpointStatus.COMPLETED]
    subsume = select_subsumed([(c.checkpoint_id, c.savepoint) for c in completed], num_retained)
    retained = [c.checkpoint_id for c in completed if c.checkpoint_id not in subsume]
    protected = set(retained) | _recently_subsumed(
        rows, set(subsume), num_retained, now_ms, grace_s
    )
    if restored_from is not None and not restored_done:
        protected.add(restored_from)
    return Retention(subsume, retained, sorted(protected))


def plan_gc(
    retention: Retention,
    manifests: Mapping[int, CheckpointManifest],
    files: Iterable[StoredFile],
    *,
    latest_completed: int,
    now_ms: int,
    grace_s: float,
    running: bool,
    pending_paths: Iterable[str] = (),
) -> GcPlan:
    """The files to delete among ``files`` (a listing of the job's root, paths relative to it).

    ``manifests`` must hold every protected checkpoint's manifest. ``running``: an attempt is
    running, so checkpoint directories above ``latest_completed`` may belong to pending
    checkpoints and are kept whatever their age. ``pending_paths``: files that acknowledged
    subtasks of pending checkpoints reference (their acks' handles).

    The listing must be taken before the catalog is read, with the acks read at that moment:
    then a listed file is either referenced by a checkpoint in the catalog, or by an ack, or is
    an upload still in flight (fresh, kept by the grace period).
    """
    missing = [cid for cid in retention.protected if cid not in manifests]
    if missing:
        raise ValueError(f"no readable manifest for checkpoints {missing}: GC deletes nothing")
    kept = [manifests[cid] for cid in retention.protected]
    stored = [f for f in files if f.path.split("/", 1)[0] not in CONTROL_DIRS]
    pending = (
        {
            cid
            for f in stored
            if (cid := JobLayout.checkpoint_id_of(f.path)) is not None and cid > latest_completed
        }
        if running
        else set()
    )
    delete = deletable(
        stored,
        kept,
        now=now_ms / 1000,
        grace_s=grace_s,
        pending_ids=pending,
        pending_paths=pending_paths,
    )
    last_used: dict[str, int] = {}
    for m in kept:
        for path in m.shared_paths():
            last_used[path] = max(last_used.get(path, 0), m.checkpoint_id)
    return GcPlan(
        delete=sorted(delete, key=lambda f: f.path),
        refcounts=refcounts(manifests[cid] for cid in retention.retained),
        last_used=last_used,
    )


def _recently_subsumed(
    rows: list[CompletedCheckpoint],
    subsuming_now: set[int],
    num_retained: int,
    now_ms: int,
    grace_s: float,
) -> set[int]:
    """Subsumed checkpoints a pending checkpoint may still build on.

    A checkpoint is subsumed when the ``num_retained``-th checkpoint after it completes; a
    checkpoint triggered before that may reference its files, and is pending at most the
    checkpoint timeout (which the grace period covers) after that moment.
    """
    ok = [c for c in rows if c.status != CheckpointStatus.CORRUPT]
    out: set[int] = set()
    for i, c in enumerate(ok):
        if c.status == CheckpointStatus.COMPLETED and c.checkpoint_id not in subsuming_now:
            continue
        later = ok[i + max(1, num_retained) :]
        subsumed_at = later[0].complete_time_ms if later else now_ms
        if now_ms - subsumed_at < grace_s * 1000:
            out.add(c.checkpoint_id)
    return out
