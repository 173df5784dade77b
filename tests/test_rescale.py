"""Rescaling keyed state on restore (state/rescale.py), on real RocksDB over the local filesystem
and moto's S3 server: subtasks at one parallelism snapshot, and the state is restored at another,
then snapshotted and restored again: 2 -> 3 -> 1 -> 4. After each step every key (value and map
state) is in exactly one new subtask, the one whose key-group range holds its key group, with its
value; nothing outside a subtask's range is left in its database."""

from __future__ import annotations

import os
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
from state.rocksdb_store import RocksDBStore, StoreOptions
from state.snapshot import SubtaskSnapshotter

JOB, OPERATOR, MAX = "job1", "count", 128
OPTS = StoreOptions(write_buffer_mib=1, target_file_size_mib=1)
KEYS = np.array([f"user-{i:06d}".encode() for i in range(12_000)], dtype=object)
GROUPS = key_groups(list(KEYS), "binary", MAX)


def expected_state() -> dict[tuple[str, bytes], bytes]:
    """Every key's value state, and one map entry per third key."""
    out = {("v", k): b"v" + k + os.urandom(40) for k in KEYS}
    out.update({("m", k): b"m" + k for k in KEYS[::3]})
    return out


def write(store: RocksDBStore, state: dict[tuple[str, bytes], bytes]) -> None:
    """The entries of ``state`` whose key group is the store's."""
    mine = np.isin(GROUPS, list(store.key_group_range))
    keys, groups = KEYS[mine], GROUPS[mine]
    txn = store.begin()
    txn.put("v", groups, list(keys), [state[("v", k)] for k in keys])
    maps = [i for i, k in enumerate(keys) if ("m", k) in state]
    txn.map_put(
        "m",
        groups[maps],
        list(keys[maps]),
        [b"mk"] * len(maps),
        [state[("m", keys[i])] for i in maps],
    )
    txn.commit()


def read(path, key_range: KeyGroupRange) -> dict[tuple[str, bytes], bytes]:
    """Everything in the database at ``path``, whatever the key groups (read as the widest
    range, so a key left outside ``key_range`` shows)."""
    out = {}
    with RocksDBStore(path, KeyGroupRange(0, MAX - 1)) as store:
        for kg in range(MAX):
            for k, v in store.items("v", kg):
                assert kg in key_range, f"key group {kg} left in a subtask owning {key_range}"
                out[("v", k)] = v
        for k, kg in zip(KEYS[::3], GROUPS[::3], strict=True):
            items = dict(store.map_items("m", int(kg), k))
            if items:
                out[("m", k)] = items[b"mk"]
    return out


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
        seen: dict = {}
        for j in range(parallelism):
            seen.update(read(self.copies(j, attempt).db_dir, key_group_range(j, parallelism, MAX)))
        return seen

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
        seen: dict = {}
        for j, report in enumerate(reports):
            got = read(job.copies(j, step).db_dir, key_group_range(j, parallelism, MAX))
            assert not seen.keys() & got.keys(), "a key restored into two subtasks"
            seen.update(got)
            assert report.source == ("local" if step % 2 == 0 else "remote"), report
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
