"""Restore keyed state at another parallelism (Flink's rescaling by key groups).

Old and new parallelism cut the same ``max_parallelism`` key groups into contiguous ranges
(state/keygroups.py), so the range of a new subtask is covered by the ranges of one or more old
subtasks. Every key of the working database starts with its key group (state/rocksdb_store.py:
values, lists, maps and timers alike), so a key group's state moves as one byte range:

1. the old subtask whose range overlaps the new one most is restored whole, local copy first
   (state/restore.py), and clipped: the key groups outside the new range are deleted by range;
2. each other overlapping old subtask is restored beside it, and the keys of its overlap are
   copied in, read in key order and written in write batches;
3. the deleted ranges stay range tombstones: compacting them is left to the first barrier
   after the restore (the driver asks for it: spark_jobs/driver/restore_step.py), off the
   restore's path, so that the first checkpoint after a rescale holds only the new range's keys
   (it uploads the subtask whole anyway: no earlier snapshot of it shares its files).

The database is assembled beside ``target`` and replaces it at the end: it appears complete or
not at all.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import rocksdict as rd

from state.handles import SubtaskStateHandle
from state.keygroups import MAX_MAX_PARALLELISM, KeyGroupRange, key_group_range
from state.local_copies import LocalCopies
from state.manifest import PartitionClock
from state.paths import JobLayout
from state.restore import RestoreReport, restore_subtask
from state.rocksdb_store import StoreOptions
from state.storage import DurableStorage

COPY_BATCH = 50_000  # keys per write batch when copying an overlap
_END = MAX_MAX_PARALLELISM.to_bytes(2, "big")  # above every key: key groups are < this


class RescaleError(RuntimeError):
    """The old subtasks' state does not cover the new range (a checkpoint of another job or of
    another ``max_parallelism``)."""


@dataclass
class RescaleReport:
    """How one new subtask was built: a restore report per old subtask read, and the keys
    copied from the ones after the first."""

    operator: str
    subtask: int
    key_group_range: KeyGroupRange
    checkpoint_id: int
    restores: list[RestoreReport] = field(default_factory=list)
    keys_copied: int = 0
    duration_s: float = 0.0

    @property
    def bytes_local(self) -> int:
        return sum(r.bytes_local for r in self.restores)

    @property
    def bytes_remote(self) -> int:
        return sum(r.bytes_remote for r in self.restores)

    @property
    def files_local(self) -> int:
        return sum(r.files_local for r in self.restores)

    @property
    def files_remote(self) -> int:
        return sum(r.files_remote for r in self.restores)

    @property
    def fallbacks(self) -> list[str]:
        return [f for r in self.restores for f in r.fallbacks]

    @property
    def source(self) -> str:
        """``local``, ``remote`` or ``mixed``, over every old subtask read."""
        sources = {r.source for r in self.restores}
        return sources.pop() if len(sources) == 1 else "mixed"


def overlap(a: KeyGroupRange, b: KeyGroupRange) -> KeyGroupRange:
    """The key groups in both (empty when none)."""
    return KeyGroupRange(max(a.start, b.start), min(a.end, b.end))


def overlapping(
    handles: Sequence[SubtaskStateHandle], new_range: KeyGroupRange
) -> list[SubtaskStateHandle]:
    """The old subtasks' handles with key groups in ``new_range``, the largest overlap first.
    Raises :class:`RescaleError` unless together they cover it."""
    found = [h for h in handles if len(overlap(h.key_group_range, new_range))]
    found.sort(key=lambda h: (-len(overlap(h.key_group_range, new_range)), h.subtask))
    expected = new_range.start  # the first key group not yet covered
    for r in sorted(overlap(h.key_group_range, new_range) for h in found):
        if r.start > expected:
            break
        expected = max(expected, r.end + 1)
    if expected <= new_range.end:
        gap_end = min(
            [r.start - 1 for h in found if (r := h.key_group_range).start > expected]
            + [new_range.end]
        )
        raise RescaleError(
            f"key groups {expected}..{gap_end} are in no old subtask's state "
            f"(old ranges: {sorted(h.key_group_range.to_list() for h in handles)})"
        )
    return found


def rescaled_clocks(
    clocks: dict[str, PartitionClock], old: int, new: int, max_parallelism: int
) -> dict[str, PartitionClock]:
    """An upstream stage's subtasks as a later stage's input partitions, restored at another
    parallelism: new subtask ``j``'s clock is the least advanced of the old subtasks whose key
    groups it takes over (the smallest largest event time, the latest records), so the later
    stage's watermark passes no point an uninterrupted run had not reached."""
    out = {}
    for j in range(new):
        mine = key_group_range(j, new, max_parallelism)
        taken = [
            clocks[str(i)]
            for i in range(old)
            if str(i) in clocks and len(overlap(key_group_range(i, old, max_parallelism), mine))
        ]
        if taken:
            out[str(j)] = PartitionClock(
                min(c.max_event_time for c in taken), max(c.last_records_ms for c in taken)
            )
    return out


def _bounds(r: KeyGroupRange) -> tuple[bytes, bytes]:
    """The byte range ``[lower, upper)`` of every key in key groups ``r``."""
    return r.start.to_bytes(2, "big"), (r.end + 1).to_bytes(2, "big")


def _clip(db: rd.Rdict, keep: KeyGroupRange, write: rd.WriteOptions) -> None:
    """Delete every key outside ``keep``, by range."""
    lower, upper = _bounds(keep)
    for a, b in ((b"\x00\x00", lower), (upper, _END)):
        if a < b:
            db.delete_range(a, b, write)


def _copy(source: Path, db: rd.Rdict, keys: KeyGroupRange, write: rd.WriteOptions) -> int:
    """Copy the keys of ``keys`` from the database at ``source`` into ``db``; returns how many."""
    lower, upper = _bounds(keys)
    read = rd.ReadOptions()
    read.set_iterate_upper_bound(upper)
    copied = 0
    src = rd.Rdict(str(source), rd.Options(raw_mode=True), access_type=rd.AccessType.read_only())
    try:
        batch = rd.WriteBatch(raw_mode=True)
        for k, v in src.items(from_key=lower, read_opt=read):
            batch.put(k, v)
            copied += 1
            if copied % COPY_BATCH == 0:
                db.write(batch, write)
                batch = rd.WriteBatch(raw_mode=True)
        if not batch.is_empty():
            db.write(batch, write)
    finally:
        src.close()
    return copied


def restore_rescaled(
    handles: Sequence[SubtaskStateHandle],
    subtask: int,
    new_range: KeyGroupRange,
    storage: DurableStorage,
    layout: JobLayout,
    target: Path,
    copies_of: Callable[[int], LocalCopies | None],
    options: StoreOptions | None = None,
) -> RescaleReport:
    """Build ``target``, the working database of new subtask ``subtask`` owning ``new_range``,
    from ``handles`` (every old subtask of one operator in one checkpoint); ``copies_of(i)``:
    this host's local copies of old subtask ``i`` (None: read durable storage only)."""
    started = time.perf_counter()
    parts = overlapping(handles, new_range)
    base = parts[0]
    report = RescaleReport(base.operator, subtask, new_range, base.checkpoint_id)
    target = Path(target)
    building = target.with_name(target.name + ".rescaling")
    shutil.rmtree(building, ignore_errors=True)
    try:
        report.restores.append(
            restore_subtask(base, storage, layout, building, copies_of(base.subtask))
        )
        write = rd.WriteOptions()
        write.disable_wal = True
        db = rd.Rdict(str(building), (options or StoreOptions()).to_rocksdb())
        try:
            _clip(db, new_range, write)
            for other in parts[1:]:
                scratch = target.with_name(f"{target.name}.from-{other.subtask}")
                try:
                    report.restores.append(
                        restore_subtask(other, storage, layout, scratch, copies_of(other.subtask))
                    )
                    keys = overlap(other.key_group_range, new_range)
                    report.keys_copied += _copy(scratch, db, keys, write)
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
            db.flush(True)
        finally:
            db.close()
        shutil.rmtree(target, ignore_errors=True)
        os.replace(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    report.duration_s = time.perf_counter() - started
    return report
