"""Merging databases by their files (state/sst_merge.py), on real RocksDB: what the merge reads is
what the parts read, point lookups included (they follow the rebuilt level-0 order, where an
older version of a key must never sort first), and a part the merge cannot read as it was is
refused with the reason, its files untouched."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import rocksdict as rd

from state.keygroups import KeyGroupRange
from state.rocksdb_options import StoreOptions
from state.rocksdb_store import RocksDBStore
from state.sst_merge import SstFile, live_sst_files, merge_by_files, why_not_mergeable

OPTS = StoreOptions(write_buffer_mib=1, target_file_size_mib=1)
HALVES = [KeyGroupRange(0, 63), KeyGroupRange(64, 127)]


def build(path, own: KeyGroupRange) -> tuple[dict[bytes, bytes], list[bytes]]:
    """A database with versions of its keys on several levels: every key written and compacted
    into the bottommost level, half overwritten in later level-0 files, a tenth deleted, and one
    state cleared by range; returns what it holds and the keys it deleted."""
    groups = list(own) * 40
    keys = [b"k%06d" % i for i in range(len(groups))]
    with RocksDBStore(path, own, OPTS) as store:
        txn = store.begin()
        txn.put("v", groups, keys, [b"old" + k for k in keys])
        txn.put("gone", groups, keys, [b"x"] * len(keys))
        txn.commit()
        store.compact()
        for part in range(2):  # two more level-0 files, each with newer versions
            txn = store.begin()
            txn.put("v", groups[part::4], keys[part::4], [b"new" + k for k in keys[part::4]])
            txn.delete("v", groups[2::10], keys[2::10])
            txn.commit()
            store.db.flush(True)
        store.clear_state("gone")
        store.db.flush(True)
        levels = {f["level"] for f in store.db.live_files()}
        assert 0 in levels and len(levels) == 2, levels  # level 0 and the bottommost
        deleted = [g.to_bytes(2, "big") + b"\x01v" + k for g, k in zip(groups, keys, strict=True)]
        return dump(store.db), deleted[2::10]


def dump(db: rd.Rdict) -> dict[bytes, bytes]:
    return dict(db.items())


def checkpoint(source, target) -> None:
    with RocksDBStore(source, KeyGroupRange(0, 127), OPTS) as store:
        store.snapshot_to(target)


def test_merged_databases_read_every_key_as_their_parts_did(tmp_path):
    expected, deleted = {}, []
    for i, own in enumerate(HALVES):
        held, gone = build(tmp_path / f"work{i}", own)
        expected.update(held)
        deleted += gone
        checkpoint(tmp_path / f"work{i}", tmp_path / f"part{i}")
    parts = [(tmp_path / f"part{i}", own) for i, own in enumerate(HALVES)]
    before = {i: dump_of(tmp_path / f"part{i}") for i in range(2)}
    assert merge_by_files(tmp_path / "merged", parts, OPTS.to_rocksdb()) is None

    db = rd.Rdict(str(tmp_path / "merged"), OPTS.to_rocksdb())
    try:
        assert {f["level"] for f in db.live_files()} == {0}  # every file at level 0
        assert dump(db) == expected
        keys = sorted(expected)
        assert db.get(keys) == [expected[k] for k in keys]  # point lookups, level-0 order
        assert not expected.keys() & set(deleted)
        assert db.get(deleted) == [None] * len(deleted)
        assert db.latest_sequence_number() >= 1
    finally:
        db.close()
    assert {i: dump_of(tmp_path / f"part{i}") for i in range(2)} == before  # read, not changed


def dump_of(path) -> dict[bytes, bytes]:
    db = rd.Rdict(str(path), rd.Options(raw_mode=True), access_type=rd.AccessType.read_only())
    try:
        return dump(db)
    finally:
        db.close()


def test_a_part_with_keys_outside_its_key_groups_is_refused_and_nothing_is_touched(tmp_path):
    for i, own in enumerate(HALVES):
        build(tmp_path / f"work{i}", own)
    with RocksDBStore(tmp_path / "work1", HALVES[1], OPTS) as store:  # a clip left by a rescale
        store.db.delete_range(b"\x00\x00", b"\x00\x40", rd.WriteOptions())
    for i in range(2):
        checkpoint(tmp_path / f"work{i}", tmp_path / f"part{i}")
    before = sorted(p.name for p in (tmp_path / "part0").iterdir())
    reason = merge_by_files(
        tmp_path / "merged",
        [(tmp_path / f"part{i}", own) for i, own in enumerate(HALVES)],
        OPTS.to_rocksdb(),
    )
    assert reason and reason.startswith("part1: file ") and "outside 64..127" in reason, reason
    assert sorted(p.name for p in (tmp_path / "part0").iterdir()) == before
    assert not (tmp_path / "merged").exists()


def test_a_directory_with_an_sst_file_that_is_not_live_is_refused(tmp_path):
    for i, own in enumerate(HALVES):
        build(tmp_path / f"work{i}", own)
        checkpoint(tmp_path / f"work{i}", tmp_path / f"part{i}")
    stray = next((tmp_path / "part1").glob("*.sst"))
    shutil.copyfile(stray, tmp_path / "part1" / "999999.sst")
    reason = merge_by_files(
        tmp_path / "merged",
        [(tmp_path / f"part{i}", own) for i, own in enumerate(HALVES)],
        OPTS.to_rocksdb(),
    )
    assert reason == "part1: its directory holds SST files that are not live"


def test_the_file_list_of_a_database_names_levels_numbers_and_sequence_numbers(tmp_path):
    build(tmp_path / "work", HALVES[1])
    files = live_sst_files(tmp_path / "work")
    assert {f.level for f in files} == {0, 6}
    assert all(64 <= f.first_key_group <= f.last_key_group <= 127 for f in files)
    newest_below = max(f.largest_seqno for f in files if f.level == 6)
    assert min(f.largest_seqno for f in files if f.level == 0) > newest_below
    assert why_not_mergeable(files, HALVES[1]) is None


def sst(level: int, number: int, largest: int, groups=(0, 9)) -> SstFile:
    return SstFile(level, number, 0, largest, *groups)


@pytest.mark.parametrize(
    "files, reason",
    [
        ([sst(0, 9, 30), sst(0, 8, 20), sst(6, 5, 0)], None),
        ([sst(0, 9, 30), sst(5, 7, 12), sst(6, 5, 0)], None),
        ([sst(0, 9, 30, (0, 10))], "file 9 spans key groups 0..10, outside 0..9"),
        ([sst(0, 9, 20), sst(0, 8, 30)], "level-0 files are not newest first"),
        ([sst(0, 9, 30), sst(5, 7, 12), sst(6, 5, 12)], "level 5 has a file with largest"),
        ([sst(0, 9, 10), sst(6, 5, 12)], "level 0 has a file with largest sequence number 10"),
    ],
)
def test_a_part_merges_only_if_every_newer_version_sorts_first(files, reason):
    got = why_not_mergeable(files, KeyGroupRange(0, 9))
    assert got == reason if reason is None else got.startswith(reason), got


def test_a_file_listing_it_cannot_read_merges_nothing(tmp_path, monkeypatch):
    for i, own in enumerate(HALVES):
        build(tmp_path / f"work{i}", own)
        checkpoint(tmp_path / f"work{i}", tmp_path / f"part{i}")

    def unreadable(path):
        raise ValueError(f"unexpected line in rocksdb.sstables of {path}: 'x'")

    monkeypatch.setattr("state.sst_merge.live_sst_files", unreadable)
    parts = [(tmp_path / f"part{i}", own) for i, own in enumerate(HALVES)]
    reason = merge_by_files(tmp_path / "merged", parts, OPTS.to_rocksdb())
    assert reason.startswith("part0: unexpected line in rocksdb.sstables"), reason


def test_a_repair_that_leaves_a_linked_file_out_is_caught_and_leaves_nothing(tmp_path, monkeypatch):
    """RocksDB's repair sets aside a file it cannot read and still succeeds: the rebuilt
    database must hold every file linked, or it does not count."""
    for i, own in enumerate(HALVES):
        build(tmp_path / f"work{i}", own)
        checkpoint(tmp_path / f"work{i}", tmp_path / f"part{i}")
    repair = rd.Rdict.repair

    def loses_a_file(path, options):
        max(Path(path).glob("*.sst")).unlink()
        repair(path, options)

    monkeypatch.setattr(rd.Rdict, "repair", loses_a_file)
    parts = [(tmp_path / f"part{i}", own) for i, own in enumerate(HALVES)]
    reason = merge_by_files(tmp_path / "merged", parts, OPTS.to_rocksdb())
    assert reason and reason.startswith("merging the files failed: "), reason
    assert "live files after the repair" in reason and not (tmp_path / "merged").exists()
