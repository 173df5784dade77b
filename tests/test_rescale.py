"""Rescaling keyed state on restore (state/rescale.py), on real RocksDB over the local filesystem
and moto's S3 server: subtasks at one parallelism snapshot, and the state is restored at another,
then snapshotted and restored again: 2 -> 3 -> 1 -> 4. After each step every entry (value, list
and map state, and timers) is in exactly one new subtask, the one whose key-group range holds its
key's group, with its value; nothing outside a subtask's range is left in its database. The
databases are read raw, every entry decoded by this test from the documented key layout
(state/rocksdb_store.py), so an entry of any kind in the wrong subtask, under the wrong key
group or in two subtasks fails."""

from __future__ import annotations

import os
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import rocksdict as rd

from state.handles import SubtaskStateHandle
from state.keygroups import KeyGroupRange, key_group_range, key_groups
from state.local_copies import LocalCopies
from state.manifest import PartitionClock
from state.paths import JobLayout
from state.rescale import RescaleError, overlapping, rescaled_clocks, restore_rescaled
from state.rocksdb_options import StoreOptions
from state.rocksdb_store import RocksDBStore
from state.snapshot import SubtaskSnapshotter
from state.store_encoding import encode_list
from state.write_buffer import BufferedTransaction

JOB, OPERATOR, MAX = "job1", "count", 128
OPTS = StoreOptions(write_buffer_mib=1, target_file_size_mib=1)
KEYS = np.array([f"user-{i:06d}".encode() for i in range(12_000)], dtype=object)
GROUPS = key_groups(list(KEYS), "binary", MAX)
GROUP_OF = dict(zip(KEYS, (int(g) for g in GROUPS), strict=True))
TIMER_BASE = 1_700_000_000_000


def expected_state() -> dict[tuple, bytes]:
    """Every key's value state; a list for every second key, a map entry for every third and a
    timer for every fifth (two for every tenth): (kind, key[, map key or timestamp]) -> value."""
    out: dict[tuple, bytes] = {("v", k): b"v" + k + os.urandom(40) for k in KEYS}
    out.update({("l", k): encode_list([b"a" + k, os.urandom(8)]) for k in KEYS[::2]})
    out.update({("m", k, b"mk"): b"m" + k for k in KEYS[::3]})
    for i, k in enumerate(KEYS[::5]):
        out[("t", k, TIMER_BASE + i)] = b""
        if i % 2 == 0:
            out[("t", k, TIMER_BASE - i)] = b""
    return out


def write(store: RocksDBStore, state: dict[tuple, bytes]) -> None:
    """The entries of ``state`` whose key group is the store's, through the store's own API."""
    mine = [e for e in state if GROUP_OF[e[1]] in store.key_group_range]
    txn = BufferedTransaction(store)
    for kind in ("v", "l"):
        keys = [e[1] for e in mine if e[0] == kind]
        txn.put(kind, [GROUP_OF[k] for k in keys], keys, [state[(kind, k)] for k in keys])
    maps = [e for e in mine if e[0] == "m"]
    txn.map_put(
        "m", [GROUP_OF[e[1]] for e in maps], [e[1] for e in maps], [e[2] for e in maps],
        [state[e] for e in maps],
    )  # fmt: skip
    timers = [e for e in mine if e[0] == "t"]
    txn.set_timers(
        "t", [GROUP_OF[e[1]] for e in timers], [e[1] for e in timers], [e[2] for e in timers],
        registered=True,
    )  # fmt: skip
    txn.commit()


def decode(raw: bytes) -> tuple[int, tuple]:
    """(key group, entry) of a raw key, by the layout state/rocksdb_store.py documents."""
    group, size = int.from_bytes(raw[:2], "big"), raw[2]
    kind, rest = raw[3 : 3 + size].decode(), raw[3 + size :]
    if kind == "m":
        (length,) = struct.unpack(">I", rest[:4])
        return group, ("m", rest[4 : 4 + length], rest[4 + length :])
    if kind == "t":
        (shifted,) = struct.unpack(">Q", rest[:8])
        return group, ("t", rest[8:], shifted - (1 << 63))
    return group, (kind, rest)


def read(path, key_range: KeyGroupRange) -> dict[tuple, bytes]:
    """Every entry in the database at ``path``, read raw: each must be under its key's own key
    group, within ``key_range``, and there once."""
    out: dict[tuple, bytes] = {}
    db = rd.Rdict(str(path), rd.Options(raw_mode=True))
    try:
        for raw, value in db.items():
            group, entry = decode(raw)
            assert group == GROUP_OF[entry[1]], f"{entry} stored under key group {group}"
            assert group in key_range, f"{entry}: key group {group} left in {key_range}"
            assert entry not in out, f"{entry} twice in one database"
            out[entry] = value
    finally:
        db.close()
    return out


def read_disjoint(parts: list[dict]) -> dict:
    """The union of subtasks' entries, each of which must be in exactly one of them."""
    seen: dict = {}
    for part in parts:
        twice = seen.keys() & part.keys()
        assert not twice, f"{len(twice)} entries in two subtasks, e.g. {sorted(twice)[:3]}"
        seen.update(part)
    return seen


class Layout:
    """The job's local state root and snapshots over one storage."""

    def __init__(self, tmp_path, storage) -> None:
        self.root, self.storage = tmp_path / "local", storage
        self.pool = ThreadPoolExecutor(2)

    def copies(self, subtask: int, attempt: int) -> LocalCopies:
        return LocalCopies(self.root, JOB, OPERATOR, subtask, attempt)

    def write_all(self, parallelism: int, state: dict) -> None:
        """``state`` into the working databases of attempt 1's subtasks."""
        for i in range(parallelism):
            kgs = key_group_range(i, parallelism, MAX)
            with RocksDBStore(self.copies(i, 1).db_dir, kgs, OPTS) as store:
                write(store, state)

    def read_all(self, parallelism: int, attempt: int) -> dict:
        """Everything the working databases of ``attempt``'s subtasks hold."""
        return read_disjoint(
            [
                read(self.copies(j, attempt).db_dir, key_group_range(j, parallelism, MAX))
                for j in range(parallelism)
            ]
        )

    def snapshot(self, parallelism: int, attempt: int, checkpoint_id: int) -> list:
        handles = []
        for i in range(parallelism):
            copies = self.copies(i, attempt)
            snap = SubtaskSnapshotter(self.storage, copies, JOB, OPERATOR, i, executor=self.pool)
            with RocksDBStore(copies.db_dir, key_group_range(i, parallelism, MAX), OPTS) as store:
                handle = snap.snapshot(store, checkpoint_id, None).result()
            copies.retain(handle)
            handles.append(handle)
        return handles

    def rescale(self, handles: list[SubtaskStateHandle], parallelism: int, attempt: int, local):
        reports = []
        for j in range(parallelism):
            new_range = key_group_range(j, parallelism, MAX)
            copies = self.copies(j, attempt)
            report = restore_rescaled(
                handles,
                j,
                new_range,
                self.storage,
                JobLayout(JOB),
                copies.db_dir,
                lambda i: self.copies(i, attempt - 1) if local else None,
                OPTS,
            )
            reports.append(report)
        return reports


def test_state_restored_at_2_then_3_then_1_then_4_subtasks_keeps_every_key_once(tmp_path, storage):
    job = Layout(tmp_path, storage)
    state = expected_state()
    job.write_all(2, state)
    handles = job.snapshot(2, attempt=1, checkpoint_id=1)
    for step, parallelism in enumerate([3, 1, 4], start=2):
        reports = job.rescale(handles, parallelism, attempt=step, local=step % 2 == 0)
        for report in reports:
            assert report.source == ("local" if step % 2 == 0 else "remote"), report
        seen = job.read_all(parallelism, attempt=step)
        assert seen == state, f"{len(seen)} entries after rescaling to {parallelism}"
        joined = [
            (r.merged_by_files, r.keys_copied > 0, "outside" in (r.copy_reason or ""))
            for r in reports
            if len(r.restores) > 1
        ]
        # 2 -> 3: the new middle subtask joins two fresh databases by their files; 3 -> 1: the
        # old subtasks, snapshotted before their first compaction, hold range tombstones outside
        # their key groups, so their keys are copied
        assert joined == {3: [(True, False, False)], 1: [(False, True, True)], 4: []}[parallelism]
        handles = job.snapshot(parallelism, attempt=step, checkpoint_id=step)
    job.pool.shutdown()


def test_scale_in_merges_the_files_of_every_other_old_subtask_and_copies_no_key(tmp_path, storage):
    job = Layout(tmp_path, storage)
    state = expected_state()
    job.write_all(4, state)
    handles = job.snapshot(4, attempt=1, checkpoint_id=1)
    reports = job.rescale(handles, 2, attempt=2, local=True)
    assert [len(r.restores) for r in reports] == [2, 2]  # each from two old subtasks
    assert [(r.merged_by_files, r.keys_copied, r.copy_reason) for r in reports] == [
        (True, 0, None)
    ] * 2
    assert job.read_all(2, attempt=2) == state
    job.pool.shutdown()


def test_a_rescaled_subtask_compacted_at_its_first_barrier_merges_by_files_again(tmp_path, storage):
    """The runtime compacts a rescaled subtask at its first barrier (its clipped ranges go), so
    a checkpoint taken after a scale-out can be scaled in by files."""
    job = Layout(tmp_path, storage)
    state = expected_state()
    job.write_all(2, state)
    job.rescale(job.snapshot(2, attempt=1, checkpoint_id=1), 4, attempt=2, local=True)
    for i in range(4):
        with RocksDBStore(job.copies(i, 2).db_dir, key_group_range(i, 4, MAX), OPTS) as store:
            store.compact()
    reports = job.rescale(job.snapshot(4, attempt=2, checkpoint_id=2), 2, attempt=3, local=False)
    assert [r.merged_by_files for r in reports] == [True, True], [r.copy_reason for r in reports]
    assert job.read_all(2, attempt=3) == state
    job.pool.shutdown()


def test_a_merge_that_rocksdb_cannot_rebuild_copies_keys_instead(tmp_path, storage, monkeypatch):
    job = Layout(tmp_path, storage)
    state = expected_state()
    job.write_all(4, state)
    handles = job.snapshot(4, attempt=1, checkpoint_id=1)

    def repair_fails(path, options):
        raise Exception(f"Corruption: cannot rebuild {path}")

    monkeypatch.setattr(rd.Rdict, "repair", repair_fails)
    reports = job.rescale(handles, 2, attempt=2, local=True)
    assert [r.merged_by_files for r in reports] == [False, False]
    assert all(r.copy_reason.startswith("merging the files failed: Corruption") for r in reports)
    assert all(r.keys_copied > 0 for r in reports)
    assert job.read_all(2, attempt=2) == state
    job.pool.shutdown()


def test_old_state_that_does_not_cover_the_new_range_is_refused_naming_the_key_groups(
    tmp_path, storage
):
    job = Layout(tmp_path, storage)
    for i in range(2):
        RocksDBStore(job.copies(i, 1).db_dir, key_group_range(i, 2, MAX), OPTS).close()
    handles = job.snapshot(2, attempt=1, checkpoint_id=1)
    with pytest.raises(RescaleError, match=r"key groups 64\.\.127 are in no old subtask's state"):
        overlapping(handles[:1], KeyGroupRange(0, 127))
    with pytest.raises(RescaleError, match=r"key groups 32\.\.63 are in no"):
        overlapping(handles[1:], KeyGroupRange(32, 95))
    job.pool.shutdown()


def test_a_later_stages_clocks_of_upstream_subtasks_are_renumbered_least_advanced_first():
    old = {str(i): PartitionClock(1_000 * (i + 1), 50 + i) for i in range(4)}
    # 4 -> 2: new subtask 0 takes old 0 and 1, new 1 takes old 2 and 3
    assert rescaled_clocks(old, 4, 2, MAX) == {
        "0": PartitionClock(1_000, 51),
        "1": PartitionClock(3_000, 53),
    }
    # 4 -> 3: new 1 (key groups 43..85) takes old 1 (32..63) and 2 (64..95)
    assert rescaled_clocks(old, 4, 3, MAX)["1"] == PartitionClock(2_000, 52)
    assert rescaled_clocks({"1": old["1"]}, 4, 1, MAX) == {"0": old["1"]}  # unseen ones stay so


def test_what_a_killed_restore_left_goes_with_its_attempts_working_database(tmp_path):
    copies = LocalCopies(tmp_path, JOB, OPERATOR, 0, attempt=3)
    left = ["db-a1", "db-a2.rescaling", "db-a2.from-1", "db-a2.restoring", "db-a3", "db-a4.x"]
    for name in left:
        (copies.root / name).mkdir(parents=True)
    assert copies.drop_older_working_dirs() == [1, 2]
    assert sorted(p.name for p in copies.root.iterdir()) == ["db-a3", "db-a4.x"]


def test_after_a_scale_in_what_older_attempts_left_beyond_the_parallelism_goes(tmp_path):
    """Attempt 5 runs at parallelism 2 and confirmed checkpoint 9: subtasks 2 and 3 lose the
    working databases of attempts before 5 and their snapshots before 9; a newer attempt's
    (a later scale-out that started meanwhile) stay, and so do subtasks 0 and 1."""
    left = {
        0: ["db-a4", "chk-7"],
        2: ["db-a3", "db-a4.rescaling", "chk-7", "chk-8"],
        3: ["db-a4", "chk-8", "db-a6", "chk-10"],
    }
    for subtask, names in left.items():
        for name in names:
            (LocalCopies(tmp_path, JOB, OPERATOR, subtask).root / name).mkdir(parents=True)
    copies = LocalCopies(tmp_path, JOB, OPERATOR, 1, attempt=5)
    assert copies.drop_beyond(2, confirmed=9) == [2, 3]
    held = {
        s: sorted(p.name for p in LocalCopies(tmp_path, JOB, OPERATOR, s).root.iterdir())
        for s in left
    }
    assert held == {0: ["chk-7", "db-a4"], 2: [], 3: ["chk-10", "db-a6"]}
    assert copies.drop_beyond(2, confirmed=9) == []


def test_a_restore_at_another_parallelism_renumbers_only_upstream_subtasks_clocks():
    """country_clicks: a source feeds clicks_by_user, whose subtasks feed clicks_by_country."""
    from cutline_sessions.pipelines import country_clicks

    from spark_jobs.driver.progress import Progress
    from state.handles import SubtaskStateHandle
    from state.manifest import CheckpointManifest

    job = country_clicks()  # parallelism 2
    handles = tuple(
        SubtaskStateHandle(s.uid, i, key_group_range(i, 4, MAX), 9, ())
        for s in job.stages
        for i in range(4)
    )
    source = {"0": PartitionClock(5_000, 1), "1": PartitionClock(7_000, 1)}
    upstream = {str(i): PartitionClock(1_000 * (i + 1), 2) for i in range(4)}
    clocks = {
        "clicks_by_user": {"clicks": source},
        "clicks_by_country": {"clicks_by_user": upstream},
    }
    manifest = CheckpointManifest(
        job.name, 9, 9, 1, 0, {}, handles, watermarks={}, partition_clocks=clocks
    )
    progress = Progress(job)
    progress.adopt(manifest)
    assert progress.clocks["clicks_by_user"]["clicks"] == source  # source partitions: as they were
    assert progress.clocks["clicks_by_country"]["clicks_by_user"] == {
        "0": PartitionClock(1_000, 2),
        "1": PartitionClock(3_000, 2),
    }
