"""A harness's checkpoints: every stage's subtask stores snapshotted as the runtime snapshots
them (incremental, with a local copy), and restored as it restores them (local copy first, or
rescaled by key group when the parallelism changed: state/rescale.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cutline.testing.records import HARNESS_JOB
from state.handles import SubtaskStateHandle
from state.keygroups import key_group_range
from state.local_copies import LocalCopies
from state.paths import JobLayout
from state.rescale import restore_rescaled
from state.restore import restore_subtask
from state.rocksdb_store import RocksDBStore
from state.snapshot import SubtaskSnapshotter
from state.storage import DurableStorage, LocalFileStorage

Copies = Callable[[str, int], LocalCopies]  # (stage uid, subtask) -> its local copies


@dataclass(frozen=True)
class HarnessSnapshot:
    """A checkpoint of every stage taken by :meth:`Harness.snapshot`: the state handles (files
    in the harness's checkpoint directory), the watermarks, the inputs' largest event times and
    the processing time."""

    checkpoint_id: int
    handles: dict[str, tuple[SubtaskStateHandle, ...]]  # per stage uid, one per subtask
    watermarks: dict[str, int]
    event_times: dict[str, dict[str, int]]  # per stage uid and input
    processing_time: int
    directory: Path
    batches: int = 0  # micro-batches run before it: the output collected up to it

    @property
    def parallelism(self) -> int:
        """The subtasks it was taken at."""
        return len(next(iter(self.handles.values()), ()))


def snapshot_stores(
    storage: DurableStorage,
    stores: Mapping[str, list[RocksDBStore]],
    bases: Mapping[str, tuple[SubtaskStateHandle, ...]],
    checkpoint_id: int,
    copies: Copies,
) -> dict[str, tuple[SubtaskStateHandle, ...]]:
    """Every stage's subtasks snapshotted into ``storage``, incremental on ``bases`` (a
    stage's previous handles, when it has them)."""
    handles = {}
    for uid, subtasks in stores.items():
        previous = bases.get(uid) or (None,) * len(subtasks)
        taken = []
        for i, (store, base) in enumerate(zip(subtasks, previous, strict=True)):
            snapshotter = SubtaskSnapshotter(storage, copies(uid, i), HARNESS_JOB, uid, i)
            taken.append(snapshotter.snapshot(store, checkpoint_id, base).result())
        handles[uid] = tuple(taken)
    return handles


def restore_stores(
    snapshot: HarnessSnapshot,
    uids: list[str],
    parallelism: int,
    max_parallelism: int,
    copies: Copies,
) -> None:
    """Each stage of ``uids`` restored from ``snapshot`` into its subtasks' working
    directories at ``parallelism``: local copy first at the snapshot's parallelism, rescaled
    from the snapshot's files (as on a new host) at another."""
    missing = sorted(set(uids) - set(snapshot.handles))
    if missing:
        raise ValueError(f"the snapshot has no state for stage(s) {missing}")
    storage = LocalFileStorage(snapshot.directory / "checkpoints")
    layout = JobLayout(HARNESS_JOB)
    rescaled = snapshot.parallelism != parallelism
    for uid in uids:
        old = snapshot.handles[uid]
        for i in range(parallelism):
            local = copies(uid, i)
            if not rescaled:
                restore_subtask(old[i], storage, layout, local.db_dir, local)
                continue
            owned = key_group_range(i, parallelism, max_parallelism)
            restore_rescaled(old, i, owned, storage, layout, local.db_dir, lambda _: None)
