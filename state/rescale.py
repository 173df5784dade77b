"""Restore keyed state at another parallelism (Flink's rescaling by key groups).

Old and new parallelism cut the same ``max_parallelism`` key groups into contiguous ranges
(state/keygroups.py), so the range of a new subtask is covered by the ranges of one or more old
subtasks. Every key of the working database starts with its key group (state/rocksdb_store.py:
values, lists, maps and timers alike), so a key group's state moves as one byte range:

1. every old subtask whose range overlaps the new one is restored, local copy first
   (state/restore.py), the one that overlaps most into the new database's directory;
2. the others join it by files when they can: their SST files are linked in and the MANIFEST is
   rebuilt over all of them (state/sst_merge.py, which checks first that this reads as the parts
   did), in C++ and without rewriting data. Otherwise (a part holds range tombstones outside its
   key groups, as one restored at another parallelism does until its first compaction) the keys
   of each overlap are copied in, read in key order and written in write batches;
3. the database is clipped: the key groups outside the new range are deleted by range;
4. the deleted ranges stay range tombstones: compacting them is left to the first barrier
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import rocksdict as rd

from state.handles import SubtaskStateHandle
from state.keygroups import KeyGroupRange, key_group_range
from state.local_copies import LocalCopies
from state.manifest import PartitionClock
from state.paths import JobLayout
from state.restore import RestoreReport, restore_subtask
from state.rocksdb_options import StoreOptions, open_rdict
from state.sst_merge import merge_by_files
from state.storage import DurableStorage

COPY_BATCH = 50_000  # keys per write batch when copying an overlap


class RescaleError(RuntimeError):
    """The old subtasks' state does not cover the new range (a checkpoint of another job or of
    another ``max_parallelism``)."""


@dataclass
class RescaleReport:
    """How one new subtask was built: a restore report per old subtask read, and how the ones
    after the first joined it: their files merged in (``merged_by_files``), or their keys copied
    (``keys_copied``, and ``copy_reason``: why the files could not be merged)."""

    operator: str
    subtask: int
    key_group_range: KeyGroupRange
    checkpoint_id: int
    restores: list[RestoreReport] = field(default_factory=list)
    merged_by_files: bool = False
    copy_reason: str | None = None
    compacted: bool = False  # so many level-0 files that RocksDB would slow writes down
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


def _clip(
    db: rd.Rdict, held: Sequence[KeyGroupRange], keep: KeyGroupRange, write: rd.WriteOptions
) -> None:
    """Delete, by range, the key groups of ``held`` (the old subtasks' ranges in ``db``) outside
    ``keep``. Only those: a range tombstone over no key would still stop the first barrier's
    compaction from moving merged files down without rewriting them."""
    for r in held:
        for outside in (
            KeyGroupRange(r.start, min(r.end, keep.start - 1)),
            KeyGroupRange(max(r.start, keep.end + 1), r.end),
        ):
            if len(outside):
                db.delete_range(*_bounds(outside), write)


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
    by_files: bool = True,
) -> RescaleReport:
    """Build ``target``, the working database of new subtask ``subtask`` owning ``new_range``,
    from ``handles`` (every old subtask of one operator in one checkpoint); ``copies_of(i)``:
    this host's local copies of old subtask ``i`` (None: read durable storage only).
    ``by_files=False`` always copies keys (the benchmark's baseline)."""
    started = time.perf_counter()
    parts = overlapping(handles, new_range)
    base = parts[0]
    report = RescaleReport(base.operator, subtask, new_range, base.checkpoint_id)
    target = Path(target)
    building = target.with_name(target.name + ".rescaling")
    shutil.rmtree(building, ignore_errors=True)
    options = options or StoreOptions()
    opts = options.to_rocksdb()
    merging = target.with_name(target.name + ".merging")
    others = [(h, target.with_name(f"{target.name}.from-{h.subtask}")) for h in parts[1:]]
    try:
        # every overlapping old subtask at once, as Flink's transfer threads do
        with ThreadPoolExecutor(len(parts), thread_name_prefix="cutline-rescale") as pool:
            restoring = [
                pool.submit(restore_subtask, h, storage, layout, dest, copies_of(h.subtask))
                for h, dest in [(base, building), *others]
            ]
            report.restores = [f.result() for f in restoring]
        if others and not by_files:
            report.copy_reason = "merging by files was not asked for"
        elif others:
            parts_at = [(building, base.key_group_range)]
            parts_at += [(scratch, h.key_group_range) for h, scratch in others]
            report.copy_reason = merge_by_files(merging, parts_at, opts)
            report.merged_by_files = report.copy_reason is None
            if report.merged_by_files:
                shutil.rmtree(building)
                os.replace(merging, building)
        write = rd.WriteOptions()
        write.disable_wal = True
        db = open_rdict(building, opts)
        try:
            held = [h.key_group_range for h in (parts if report.merged_by_files else [base])]
            _clip(db, held, new_range, write)
            if not report.merged_by_files:
                for other, scratch in others:
                    keys = overlap(other.key_group_range, new_range)
                    report.keys_copied += _copy(scratch, db, keys, write)
            db.flush(True)
            if db.property_int_value("rocksdb.num-files-at-level0") >= options.l0_slowdown_trigger:
                db.compact_range(None, None)  # writes would stall until it is done anyway
                report.compacted = True
        finally:
            db.close()
        shutil.rmtree(target, ignore_errors=True)
        os.replace(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(merging, ignore_errors=True)
        for _, scratch in others:
            shutil.rmtree(scratch, ignore_errors=True)
    report.duration_s = time.perf_counter() - started
    return report
