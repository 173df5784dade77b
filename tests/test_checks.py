"""The storage bound of the ``storage_bounded`` check against a model of a running job: storage
that retention GC keeps within its lawful lag stays under the bound for hours; storage that
nothing collects exceeds it within the hour."""

from __future__ import annotations

from dataclasses import dataclass

from orchestration.assets.checks import lawful_garbage_s, storage_bound
from orchestration.maintenance import RETENTION_INTERVAL_S
from state.catalog import CheckpointStatus, CompletedCheckpoint

MB = 1 << 20
GRACE_S = 600.0  # the example jobs' checkpoint timeout, GC's default grace period


@dataclass
class Upload:
    at_s: float
    size: int
    unreferenced_at_s: float


def row(cid: int, at_s: float, full: int, uploaded: int, status) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        job_id="j", checkpoint_id=cid, batch_id=cid, attempt=1, trigger_time_ms=int(at_s * 1000),
        complete_time_ms=int(at_s * 1000), metadata_path=f"j/chk-{cid}/_metadata",
        full_size=full, incremental_size=uploaded, file_count=1, sync_ms=1.0, async_ms=1.0,
        status=status,
    )  # fmt: skip


def worst_over_run(hours: float, gc: bool, window_s: float) -> float:
    """Largest stored/bound over a run: a 100 MB state, a checkpoint every 3 s uploading 2 MB
    that replace 2 MB which no checkpoint needs once two later ones completed (2 retained); GC
    every retention interval deleting what no checkpoint needs and is older than the grace."""
    state, upload, every, retained = 100 * MB, 2 * MB, 3.0, 2
    uploads = [Upload(0.0, state, float("inf"))]
    rows: list[CompletedCheckpoint] = []
    worst, t, cid, next_gc = 0.0, 0.0, 0, RETENTION_INTERVAL_S
    while t < hours * 3600:
        t += every
        cid += 1
        uploads.append(Upload(t, upload, t + retained * every))
        rows.append(row(cid, t, state, upload, CheckpointStatus.COMPLETED))
        if len(rows) > retained:
            rows[-retained - 1] = row(cid - retained, t, state, upload, CheckpointStatus.SUBSUMED)
        if gc and t >= next_gc:
            next_gc += RETENTION_INTERVAL_S
            collectable = [u for u in uploads if u.unreferenced_at_s <= t and t - u.at_s > GRACE_S]
            uploads = [u for u in uploads if u not in collectable]
        stored = sum(u.size for u in uploads)
        bound = storage_bound(rows[-1000:], retained, int(t * 1000), window_s)
        worst = max(worst, stored / bound)
    return worst


def test_the_bound_holds_while_retention_keeps_up_and_catches_unbounded_growth():
    window = lawful_garbage_s(GRACE_S)
    assert worst_over_run(3, gc=True, window_s=window) <= 1.0, "a healthy job failed the check"
    assert worst_over_run(1, gc=False, window_s=window) > 1.0, "unbounded growth went unnoticed"
    # an allowance of only the grace period, as before: a healthy job fails within the hour
    assert worst_over_run(1, gc=True, window_s=GRACE_S) > 1.0
