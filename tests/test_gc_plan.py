"""The GC plan (state.gc): the seed's CP 1 to CP 4 walk-through through a whole GC pass, and what
a pass must never delete."""

from __future__ import annotations

import pytest

from state.catalog import CheckpointStatus, CompletedCheckpoint
from state.gc import plan_gc, select_retention
from state.handles import StateFile, SubtaskStateHandle
from state.keygroups import KeyGroupRange
from state.manifest import CheckpointManifest
from state.registry import StoredFile

MINUTE = 60_000
GRACE_S = 60.0


def manifest(n: int, *ssts: str) -> CheckpointManifest:
    files = [StateFile(f"{s}.sst", f"shared/op/0/{s}.sst", 10, "crc32:0") for s in ssts]
    files.append(StateFile("MANIFEST-1", f"chk-{n}/op/0/MANIFEST-1", 1, "crc32:0"))
    handle = SubtaskStateHandle("op", 0, KeyGroupRange(0, 127), n, tuple(files))
    return CheckpointManifest("job", n, n, 1, n, {}, (handle,))


def row(n: int, complete_ms: int, status=CheckpointStatus.COMPLETED, savepoint=False):
    return CompletedCheckpoint(
        job_id="job", checkpoint_id=n, batch_id=n, attempt=1, trigger_time_ms=complete_ms - 5,
        complete_time_ms=complete_ms, metadata_path=f"job/chk-{n}/_metadata", full_size=1,
        incremental_size=1, file_count=1, sync_ms=0, async_ms=0, status=status,
        savepoint=savepoint,
    )  # fmt: skip


def stored(manifests, modified_s: float = 0.0) -> list[StoredFile]:
    paths = {p for m in manifests for p in m.referenced_paths()}
    return [StoredFile(p, 10, modified_s) for p in sorted(paths)]


def gc_pass(rows, manifests, files, now_ms, *, num_retained=2, running=False, **kw):
    retention = select_retention(
        rows, num_retained=num_retained, now_ms=now_ms, grace_s=GRACE_S, **kw
    )
    plan = plan_gc(
        retention,
        {cid: manifests[cid] for cid in retention.protected},
        files,
        latest_completed=max(retention.retained),
        now_ms=now_ms,
        grace_s=GRACE_S,
        running=running,
    )
    return retention, plan


def test_seed_walkthrough_through_a_gc_pass_after_each_checkpoint():
    """flink-incremental-checkpointing.txt, two retained: the same files, counts, deletions.
    Each checkpoint completes ten minutes after the last; GC runs once the grace period after
    it has passed (until then a subsumed checkpoint's files stay for pending checkpoints)."""
    seed = {
        1: manifest(1, "s1", "s2"),
        2: manifest(2, "s1", "s2", "s3", "s4"),
        3: manifest(3, "s123", "s4", "s5"),
        4: manifest(4, "s123", "s456"),
    }
    counts = {
        1: {"s1": 1, "s2": 1},
        2: {"s1": 2, "s2": 2, "s3": 1, "s4": 1},
        3: {"s1": 1, "s2": 1, "s3": 1, "s4": 2, "s123": 1, "s5": 1},
        4: {"s123": 2, "s4": 1, "s5": 1, "s456": 1},
    }
    deleted_shared = {1: set(), 2: set(), 3: set(), 4: {"s1", "s2", "s3"}}
    rows: list[CompletedCheckpoint] = []
    files: list[StoredFile] = []
    for n in (1, 2, 3, 4):
        now = n * 10 * MINUTE
        rows.append(row(n, now))
        known = {f.path for f in files}
        files += [f for f in stored([seed[n]], now / 1000) if f.path not in known]
        retention, plan = gc_pass(rows, seed, files, now + int(GRACE_S * 1000) + 1)
        assert plan.refcounts == {f"shared/op/0/{k}.sst": v for k, v in counts[n].items()}
        gone = {f.path for f in plan.delete}
        assert {p for p in gone if p.startswith("shared/")} == {
            f"shared/op/0/{k}.sst" for k in deleted_shared[n]
        }, f"CP {n}"
        # the subsumed checkpoint's private files and manifest go with it
        expected_private = set()
        if n in (3, 4):
            expected_private = {
                f"chk-{n - 2}/{f}" for f in ("_metadata", "_claim", "op/0/MANIFEST-1")
            }
        assert {p for p in gone if p.startswith("chk-")} == expected_private, f"CP {n}"
        rows = [
            row(c.checkpoint_id, c.complete_time_ms, CheckpointStatus.SUBSUMED)
            if c.checkpoint_id in retention.subsume
            else c
            for c in rows
        ]
        files = [f for f in files if f.path not in gone]
    assert [c.checkpoint_id for c in rows if c.status == CheckpointStatus.COMPLETED] == [3, 4]


def test_files_a_pending_checkpoint_may_build_on_stay_for_the_grace_period():
    """Checkpoint 1 was just subsumed: a checkpoint triggered before that may reference its
    files, so they stay until the grace period after its subsumption has passed."""
    seed = {1: manifest(1, "a"), 2: manifest(2, "b"), 3: manifest(3, "c")}
    rows = [row(1, 1 * MINUTE), row(2, 2 * MINUTE), row(3, 3 * MINUTE)]
    files = stored(seed.values())
    retention, plan = gc_pass(rows, seed, files, 3 * MINUTE + 1000)
    assert retention.subsume == [1] and retention.protected == [1, 2, 3]
    assert plan.delete == []
    retention, plan = gc_pass(rows, seed, files, 3 * MINUTE + int(GRACE_S * 1000) + 1)
    assert {f.path for f in plan.delete} == seed[1].referenced_paths()


def test_pending_checkpoints_acks_and_fresh_uploads_are_never_deleted():
    seed = {1: manifest(1, "a")}
    old = 0.0
    files = [
        *stored(seed.values(), old),
        StoredFile("chk-2/op/0/MANIFEST-1", 1, old),  # pending checkpoint 2 (no _metadata yet)
        StoredFile("_acks/chk-2/op-0.json", 1, old),
        StoredFile("shared/op/0/fresh.sst", 1, 3600.0),  # a pending upload, within the grace
        StoredFile("shared/op/0/orphan.sst", 1, old),  # nobody's, older than the grace
    ]
    now = 3600 * 1000 + 1000
    _, plan = gc_pass([row(1, 0)], seed, files, now, running=True)
    assert [f.path for f in plan.delete] == ["shared/op/0/orphan.sst"]
    _, plan = gc_pass([row(1, 0)], seed, files, now, running=False)  # nothing is pending
    assert [f.path for f in plan.delete] == ["chk-2/op/0/MANIFEST-1", "shared/op/0/orphan.sst"]


def test_restored_from_checkpoint_and_savepoints_are_kept():
    seed = {n: manifest(n, f"s{n}") for n in (1, 2, 3, 4)}
    rows = [row(1, 0, savepoint=True), row(2, 0), row(3, 0), row(4, 0)]
    now = 3600 * 1000
    # attempt restored checkpoint 2 (explicitly), nothing completed since
    retention, plan = gc_pass(
        rows, seed, stored(seed.values()), now, num_retained=1, restored_from=2,
        restored_done=False,
    )  # fmt: skip
    assert retention.subsume == [2, 3] and retention.retained == [1, 4]
    assert retention.protected == [1, 2, 4]
    assert {f.path for f in plan.delete} == seed[3].referenced_paths()


def test_a_protected_checkpoint_without_manifest_stops_the_pass():
    rows = [row(1, 0), row(2, 0)]
    retention = select_retention(rows, num_retained=2, now_ms=0, grace_s=GRACE_S)
    with pytest.raises(ValueError, match=r"no readable manifest for checkpoints \[2\]"):
        plan_gc(
            retention, {1: manifest(1, "a")}, [], latest_completed=2, now_ms=0, grace_s=1,
            running=False,
        )  # fmt: skip
