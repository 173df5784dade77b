"""Refcounts and deletion rules, including the seed's CP 1 to CP 4 walk-through."""

from __future__ import annotations

from state.handles import StateFile, SubtaskStateHandle
from state.keygroups import KeyGroupRange
from state.manifest import CheckpointManifest
from state.registry import StoredFile, deletable, refcounts, select_subsumed


def cp(n: int, *ssts: str) -> CheckpointManifest:
    files = [StateFile(f"{s}.sst", f"shared/op/0/{s}.sst", 1, "crc32:0") for s in ssts]
    files.append(StateFile("MANIFEST-1", f"chk-{n}/op/0/MANIFEST-1", 1, "crc32:0"))
    handle = SubtaskStateHandle("op", 0, KeyGroupRange(0, 127), n, tuple(files))
    return CheckpointManifest("job", n, n, 1, n, {}, (handle,))


def shared(name: str) -> str:
    return f"shared/op/0/{name}.sst"


def test_seed_walkthrough_cp1_to_cp4_with_two_retained():
    """flink-incremental-checkpointing.txt: same files, same counts, same deletions."""
    num_retained = 2
    checkpoints = {
        1: cp(1, "s1", "s2"),
        2: cp(2, "s1", "s2", "s3", "s4"),
        3: cp(3, "s123", "s4", "s5"),
        4: cp(4, "s123", "s456"),
    }
    expected_counts = {
        1: {"s1": 1, "s2": 1},
        2: {"s1": 2, "s2": 2, "s3": 1, "s4": 1},
        3: {"s1": 1, "s2": 1, "s3": 1, "s4": 2, "s123": 1, "s5": 1},
        4: {"s123": 2, "s4": 1, "s5": 1, "s456": 1},
    }
    expected_deleted = {1: set(), 2: set(), 3: set(), 4: {"s1", "s2", "s3"}}
    uploaded: set[str] = set()
    deleted: set[str] = set()
    completed: list[int] = []
    for n in (1, 2, 3, 4):
        uploaded |= checkpoints[n].shared_paths()
        completed.append(n)
        subsumed = select_subsumed([(c, False) for c in completed], num_retained)
        completed = [c for c in completed if c not in subsumed]
        retained = [checkpoints[c] for c in completed]
        counts = refcounts(retained)
        assert counts == {shared(k): v for k, v in expected_counts[n].items()}, f"CP {n}"
        stored = [StoredFile(p, 1, modified=0.0) for p in sorted(uploaded - deleted)]
        gone = {f.path for f in deletable(stored, retained, now=100.0, grace_s=10.0)}
        shared_gone = {p for p in gone if p.startswith("shared/")}
        assert shared_gone == {shared(k) for k in expected_deleted[n]}, f"CP {n}"
        deleted |= shared_gone
    assert completed == [3, 4]


def test_grace_period_protects_fresh_unreferenced_uploads():
    retained = [cp(1, "a")]
    files = [
        StoredFile(shared("a"), 1, 0.0),
        StoredFile(shared("orphan-old"), 1, 0.0),
        StoredFile(shared("orphan-new"), 1, 95.0),
        StoredFile("chk-1/_metadata", 1, 0.0),
        StoredFile("chk-1/op/0/MANIFEST-1", 1, 0.0),
        StoredFile("chk-0/op/0/MANIFEST-1", 1, 0.0),
    ]
    gone = {f.path for f in deletable(files, retained, now=100.0, grace_s=10.0)}
    assert gone == {shared("orphan-old"), "chk-0/op/0/MANIFEST-1"}


def test_pending_and_restored_from_checkpoints_are_protected():
    restored = cp(5, "r")
    files = [
        StoredFile(shared("r"), 1, 0.0),
        StoredFile("chk-5/_metadata", 1, 0.0),
        StoredFile("chk-7/op/0/MANIFEST-1", 1, 0.0),  # pending checkpoint 7, no manifest yet
        StoredFile(shared("p"), 1, 0.0),  # uploaded for pending checkpoint 7
        StoredFile(shared("x"), 1, 0.0),
    ]
    gone = deletable(
        files,
        [cp(6, "y")],
        now=100.0,
        grace_s=0.0,
        restored_from=[restored],
        pending_ids=[7],
        pending_paths=[shared("p")],
    )
    assert [f.path for f in gone] == [shared("x")]


def test_select_subsumed_never_takes_the_latest_or_savepoints():
    assert select_subsumed([(1, False), (2, False), (3, False)], 1) == [1, 2]
    assert select_subsumed([(1, True), (2, False), (3, False)], 1) == [2]
    assert select_subsumed([(1, False)], 1) == []
    assert select_subsumed([(4, False), (1, False), (9, True)], 5) == []
