"""Snapshots (sync + async, incremental) and local-first restore of one subtask, on real RocksDB.

``storage`` (tests/conftest.py) runs each test on the local filesystem and on moto's S3 server.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import state.restore as restore_module
from spark_jobs.executor.subtask import naming_the_subtask
from state.backend import StateBackendError
from state.keygroups import KeyGroupRange
from state.local_copies import LocalCopies
from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.restore import ChecksumMismatchError, restore_subtask, validate_checkpoint
from state.rocksdb_options import StoreOptions
from state.rocksdb_store import RocksDBStore
from state.snapshot import SubtaskSnapshotter
from state.storage import LocalFileStorage, MissingFileError
from tests.fakes import FaultyStorage

JOB = "job1"
RANGE = KeyGroupRange(0, 63)
OPTS = StoreOptions(write_buffer_mib=1, target_file_size_mib=1)


class Subtask:
    """One subtask's store, local copies and snapshotter, over a given storage."""

    def __init__(self, tmp_path, storage, **kw):
        self.storage = storage
        self.copies = LocalCopies(tmp_path / "local", JOB, "count", 0)
        self.store = RocksDBStore(self.copies.db_dir, RANGE, OPTS)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="test-async")
        self.snapshotter = SubtaskSnapshotter(
            storage, self.copies, JOB, "count", 0, executor=self.pool, **kw
        )

    def write(self, start: int, n: int, value: bytes, text: bool = False) -> None:
        """Set keys [start, start + n) to ``value`` plus 60 random bytes (as hex: ``text``)."""
        keys = [f"key-{i:08d}".encode() for i in range(start, start + n)]
        noise = os.urandom(30 * n).hex().encode() if text else os.urandom(60 * n)
        values = [value + noise[i * 60 : (i + 1) * 60] for i in range(n)]
        txn = self.store.begin()
        txn.put("v", np.arange(start, start + n) % 64, keys, values)
        txn.commit()

    def contents(self) -> dict[bytes, bytes]:
        return {k: v for kg in RANGE for k, v in self.store.items("v", kg)}


def contents_of(path, options: StoreOptions | None = None) -> dict[bytes, bytes]:
    with RocksDBStore(path, RANGE, options) as s:
        return {k: v for kg in RANGE for k, v in s.items("v", kg)}


@pytest.fixture
def sub(tmp_path, storage):
    s = Subtask(tmp_path, storage, incremental=True, local_recovery=True)
    yield s
    s.store.close()
    s.pool.shutdown()


def test_incremental_snapshot_reuses_files_of_the_confirmed_checkpoint(sub):
    sub.write(0, 40_000, b"x" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    assert h1.uploaded_bytes == h1.full_size > 1_000_000
    assert all(f.shared == f.local_name.endswith(".sst") for f in h1.files)
    sub.write(0, 400, b"y" * 100)  # 1% churn
    h2 = sub.snapshotter.snapshot(sub.store, 2, h1).result()
    reused = {f.path for f in h2.files} & {f.path for f in h1.files}
    assert reused, "SST files of checkpoint 1 are re-referenced, not uploaded again"
    assert h2.uploaded_bytes < 0.2 * h2.full_size
    assert all(f.path.startswith("chk-2/") for f in h2.files if not f.shared)
    assert h1.sync_ms > 0 and h1.async_ms > 0


def test_full_snapshots_upload_everything_privately(tmp_path, storage):
    sub = Subtask(tmp_path, storage, incremental=False)
    sub.write(0, 5000, b"x" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    h2 = sub.snapshotter.snapshot(sub.store, 2, h1).result()
    assert not any(f.shared for f in h1.files + h2.files)
    assert h2.uploaded_bytes == h2.full_size
    sub.store.close()


def test_restore_prefers_the_local_copy(sub, tmp_path):
    sub.write(0, 20_000, b"a" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    sub.write(0, 200, b"b" * 100)
    h2 = sub.snapshotter.snapshot(sub.store, 2, h1).result()
    expected = sub.contents()
    sub.write(0, 20_000, b"after the checkpoint")
    sub.store.close()
    report = restore_subtask(h2, sub.storage, JobLayout(JOB), sub.copies.db_dir, sub.copies)
    assert report.source == "local"
    assert report.bytes_local == sum(f.size for f in h2.files) and report.bytes_remote == 0
    assert contents_of(sub.copies.db_dir) == expected


def test_restore_from_remote_when_the_local_copy_is_gone(sub, tmp_path):
    sub.write(0, 20_000, b"a" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    expected = sub.contents()
    sub.store.close()
    sub.copies.discard(1)
    target = tmp_path / "elsewhere" / "db"
    report = restore_subtask(h1, sub.storage, JobLayout(JOB), target, sub.copies)
    assert report.source == "remote" and report.bytes_remote == sum(f.size for f in h1.files)
    assert "no local copy of checkpoint 1" in report.fallbacks
    assert contents_of(target) == expected


def test_corrupt_local_file_falls_back_to_the_remote_copy(sub):
    sub.write(0, 20_000, b"a" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    expected = sub.contents()
    sub.store.close()
    directory, _ = sub.copies.find(1)
    sst = max((f for f in h1.files if f.shared), key=lambda f: f.size)
    data = bytearray((directory / sst.local_name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    os.unlink(directory / sst.local_name)  # break the hard link, then write the damaged copy
    (directory / sst.local_name).write_bytes(bytes(data))
    report = restore_subtask(h1, sub.storage, JobLayout(JOB), sub.copies.db_dir, sub.copies)
    assert report.source == "mixed"
    assert report.bytes_remote == sst.size
    assert any("checksum mismatch" in f for f in report.fallbacks)
    assert contents_of(sub.copies.db_dir) == expected


def settled_snapshot(sub) -> tuple:
    """Checkpoint 1 of state whose SST files were written a minute before the snapshot that
    reads them (their identity settled: state/local_copies.py); the store closed. Returns the
    handle, the state, the local copy's directory and its largest shared file."""
    sub.write(0, 20_000, b"a" * 100)
    sub.store.db.flush(True)
    then = time.time_ns() - 60 * 10**9
    for path in sub.copies.db_dir.glob("*.sst"):
        os.utime(path, ns=(then, then))
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    expected = sub.contents()
    sub.store.close()
    directory, _ = sub.copies.find(1)
    return h1, expected, directory, max((f for f in h1.files if f.shared), key=lambda f: f.size)


def counting_reads(monkeypatch) -> list[str]:
    """The names of the local files a restore reads for their checksum."""
    read, checksum = [], restore_module.file_checksum

    def counted(path):
        read.append(os.path.basename(path))
        return checksum(path)

    monkeypatch.setattr(restore_module, "file_checksum", counted)
    return read


def test_a_restore_reads_no_local_file_whose_bytes_the_upload_read(sub, monkeypatch):
    h1, expected, _, _ = settled_snapshot(sub)
    settled = {f.local_name for f in h1.files if f.local_name.endswith(".sst")}
    read = counting_reads(monkeypatch)
    report = restore_subtask(h1, sub.storage, JobLayout(JOB), sub.copies.db_dir, sub.copies)
    assert report.source == "local" and report.files_unread == len(settled) > 0
    assert not settled & set(read), "files the upload read are taken by their checksum"
    assert sorted(read) == sorted({f.local_name for f in h1.files} - settled)  # written just now
    assert contents_of(sub.copies.db_dir) == expected


def test_a_local_file_written_after_the_upload_read_it_is_read_again_and_replaced(sub, monkeypatch):
    h1, expected, directory, sst = settled_snapshot(sub)
    with open(directory / sst.local_name, "r+b") as f:  # in place: same inode, same size
        f.seek(sst.size // 2)
        byte = f.read(1)
        f.seek(sst.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    read = counting_reads(monkeypatch)
    report = restore_subtask(h1, sub.storage, JobLayout(JOB), sub.copies.db_dir, sub.copies)
    assert sst.local_name in read
    assert report.source == "mixed" and report.bytes_remote == sst.size
    assert any("checksum mismatch" in f for f in report.fallbacks)
    assert contents_of(sub.copies.db_dir) == expected


def test_bytes_changed_behind_the_file_system_are_found_by_rocksdb_then_replaced(sub):
    """A failing disk changes bytes without a new modification time: the restore takes the
    file by its recorded checksum, RocksDB's block checksum finds it, the subtask's failure
    makes the next restore read every local file, and the file comes from the primary copy."""
    h1, expected, directory, sst = settled_snapshot(sub)
    path = directory / sst.local_name
    stat = path.stat()
    with open(path, "r+b") as f:
        f.seek(sst.size // 3)
        f.write(b"\0" * 64)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the time it had

    layout = JobLayout(JOB)
    report = restore_subtask(h1, sub.storage, layout, sub.copies.db_dir, sub.copies)
    assert report.source == "local" and report.files_unread >= 1
    # read through block caches of their own: the process's holds the file's blocks as read
    # before the damage (RocksDB keys them by the file, whatever its path)
    uncached = [StoreOptions(block_cache_mib=mib) for mib in (3, 5)]
    corrupt = pytest.raises(StateBackendError, match="Corruption")
    with corrupt as failed, naming_the_subtask("count", 0, sub.copies):
        contents_of(sub.copies.db_dir, uncached[0])
    assert "stage 'count' subtask 0" in str(failed.value)

    report = restore_subtask(h1, sub.storage, layout, sub.copies.db_dir, sub.copies)
    assert report.files_unread == 0
    assert report.source == "mixed" and report.bytes_remote == sst.size
    assert contents_of(sub.copies.db_dir, uncached[1]) == expected


def test_a_local_file_gone_after_its_check_is_read_from_the_remote_copy(sub, monkeypatch):
    """A cleanup on the host (LocalCopies.drop_beyond, by a subtask of another attempt) may
    delete a local copy between its check and its use."""
    sub.write(0, 20_000, b"a" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    expected = sub.contents()
    sub.store.close()
    assert sub.copies.find(1) is not None  # a local copy, checked whole before each use
    sst = max((f for f in h1.files if f.shared), key=lambda f: f.size)
    place = restore_module._place_local

    def deleted_meanwhile(candidate, target):
        if candidate.name == sst.local_name:
            raise FileNotFoundError(f"No such file or directory: {str(candidate)!r}")
        place(candidate, target)

    monkeypatch.setattr(restore_module, "_place_local", deleted_meanwhile)
    report = restore_subtask(h1, sub.storage, JobLayout(JOB), sub.copies.db_dir, sub.copies)
    assert report.source == "mixed" and report.bytes_remote == sst.size
    assert any(f.startswith(f"local {sst.local_name}: No such file") for f in report.fallbacks)
    assert contents_of(sub.copies.db_dir) == expected


def test_missing_remote_file_is_an_error_naming_it(sub, tmp_path):
    sub.write(0, 5000, b"a" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    sub.store.close()
    sub.copies.discard(1)
    victim = next(f for f in h1.files if f.shared)
    sub.storage.delete(JobLayout(JOB).job_path(victim.path))
    with pytest.raises(MissingFileError, match=victim.path.split("/")[-1]):
        restore_subtask(h1, sub.storage, JobLayout(JOB), tmp_path / "r" / "db", sub.copies)
    assert not (tmp_path / "r" / "db").exists(), "a failed restore leaves no half-built database"


def test_remote_file_with_wrong_contents_is_detected(sub, tmp_path):
    sub.write(0, 5000, b"a" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    sub.store.close()
    sub.copies.discard(1)
    victim = next(f for f in h1.files if f.shared)
    path = JobLayout(JOB).job_path(victim.path)
    data = bytearray(sub.storage.get_bytes(path))
    data[0] ^= 0xFF
    sub.storage.put_bytes(path, bytes(data))
    with pytest.raises(ChecksumMismatchError, match=victim.path):
        restore_subtask(h1, sub.storage, JobLayout(JOB), tmp_path / "r" / "db", sub.copies)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_the_durable_copy_is_encoded_and_a_remote_restore_gives_every_byte(tmp_path, codec):
    storage = LocalFileStorage(tmp_path / "remote")
    sub = Subtask(tmp_path, storage, codec=codec)
    sub.write(0, 5000, b"", text=True)  # text, which zstd shrinks
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    expected = sub.contents()
    sub.store.close()
    stored = {f.local_name: storage.get_bytes(JobLayout(JOB).job_path(f.path)) for f in h1.files}
    assert h1.uploaded_bytes == h1.full_size == sum(len(b) for b in stored.values())
    local = sub.copies.find(1)[0]
    sst = next(f for f in h1.files if f.shared)
    if codec == "none":
        assert stored[sst.local_name] == (local / sst.local_name).read_bytes()
    else:
        assert h1.full_size < 0.7 * sum(f.size for f in h1.files)
    report = restore_subtask(h1, storage, JobLayout(JOB), tmp_path / "r" / "db", None)
    assert report.source == "remote" and contents_of(tmp_path / "r" / "db") == expected


def test_the_encoded_copy_is_written_on_the_local_disk_and_removed(sub, tmp_path, monkeypatch):
    """The upload encodes each file beside the snapshot (the executor's local disk), never in the
    system's temporary directory (memory on a tmpfs host), and leaves no encoded copy behind,
    whether its upload succeeds or fails."""
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    sources: list[Path] = []
    put_file = sub.storage.put_file

    def recording(local_path, path):
        sources.append(Path(local_path))
        return put_file(local_path, path)

    monkeypatch.setattr(sub.storage, "put_file", recording)
    sub.write(0, 5000, b"a" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    local = sub.copies.snapshot_dir(1)
    assert len(sources) == len(h1.files) and {p.parent for p in sources} == {local}
    assert all(p.name.startswith(".") and p.name.endswith(".zstd") for p in sources)
    assert not any(p.exists() for p in sources) and not any(system_tmp.iterdir())
    sub.write(0, 5000, b"b" * 100)

    def failing(local_path, path):
        raise OSError("injected storage fault")

    monkeypatch.setattr(sub.storage, "put_file", failing)
    directory = sub.copies.snapshot_dir(2)
    real_discard = sub.copies.discard
    left: list[str] = []

    def discard(checkpoint_id):  # what the failed upload leaves, seen before its directory goes
        left.extend(p.name for p in directory.iterdir() if p.name.startswith("."))
        real_discard(checkpoint_id)

    monkeypatch.setattr(sub.copies, "discard", discard)
    with pytest.raises(OSError, match="injected storage fault"):
        sub.snapshotter.snapshot(sub.store, 2, h1).result()
    assert left == [] and not any(system_tmp.iterdir())


def test_a_compressed_copy_damaged_inside_is_refused_naming_it(sub, tmp_path):
    sub.write(0, 5000, b"a" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    sub.store.close()
    sub.copies.discard(1)
    victim = max((f for f in h1.files if f.shared), key=lambda f: f.stored_size)
    assert victim.codec == "zstd" and victim.stored_size < victim.size
    path = JobLayout(JOB).job_path(victim.path)
    data = bytearray(sub.storage.get_bytes(path))
    data[len(data) // 2] ^= 0x55
    sub.storage.put_bytes(path, bytes(data))
    with pytest.raises(ChecksumMismatchError, match=victim.path):
        restore_subtask(h1, sub.storage, JobLayout(JOB), tmp_path / "r" / "db", sub.copies)
    assert not (tmp_path / "r" / "db").exists(), "a failed restore leaves no half-built database"
    manifest = CheckpointManifest(JOB, 1, 1, 1, 0, {}, (h1,))
    problems = validate_checkpoint(manifest, sub.storage, checksums=True)
    assert problems == [f"{path}: checksum mismatch (expected {victim.checksum})"]


def test_upload_failing_midway_fails_the_snapshot_and_keeps_the_previous_one(tmp_path, storage):
    faulty = FaultyStorage(storage)
    sub = Subtask(tmp_path, faulty, incremental=True, local_recovery=True)
    sub.write(0, 20_000, b"a" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    expected = sub.contents()
    sub.write(0, 20_000, b"b" * 100)  # rewrites every key: checkpoint 2 needs new files
    calls = {"n": 0}

    def second_put_fails(path: str) -> bool:
        calls["n"] += 1
        return calls["n"] == 2

    faulty.fail_put = second_put_fails
    with pytest.raises(OSError, match="injected storage fault"):
        sub.snapshotter.snapshot(sub.store, 2, h1).result()
    assert len(faulty.puts) >= 1, "the fault hit midway, after a first file was uploaded"
    assert sub.copies.find(2) is None and not sub.copies.snapshot_dir(2).exists()
    sub.store.close()
    sub.copies.discard(1)  # force the restore to read the primary copy
    target = tmp_path / "restored" / "db"
    restore_subtask(h1, storage, JobLayout(JOB), target, sub.copies)
    assert contents_of(target) == expected
    sub.pool.shutdown()


def test_failure_to_keep_the_local_copy_does_not_fail_the_checkpoint(sub, monkeypatch):
    def disk_full(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(LocalCopies, "_write_handle", staticmethod(disk_full))
    sub.write(0, 1000, b"a" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    assert h1.files
    assert sub.copies.find(1) is None
    assert not sub.copies.snapshot_dir(1).exists()


def test_confirm_keeps_only_the_latest_confirmed_and_pending_copies(sub):
    handles = {}
    base = None
    for n in (1, 2, 3):
        sub.write(n * 100, 100, b"v")
        handles[n] = base = sub.snapshotter.snapshot(sub.store, n, base).result()
    assert sub.copies.checkpoint_ids() == [1, 2, 3]
    assert sub.copies.confirm(2) == [1]
    assert sub.copies.checkpoint_ids() == [2, 3]  # 3 is still pending
    assert sub.copies.find(2)[1] == handles[2]


def test_asynchronous_part_does_not_stall_processing(tmp_path):
    gate = threading.Event()
    storage = FaultyStorage(LocalFileStorage(tmp_path / "remote"))
    storage.fail_put = lambda path: not gate.wait(timeout=30)  # blocks uploads until released
    sub = Subtask(tmp_path, storage, incremental=True)
    sub.write(0, 5000, b"a" * 100)
    future = sub.snapshotter.snapshot(sub.store, 1, None)
    # The upload is blocked, yet the caller goes on processing the next micro-batches.
    for batch in range(3):
        sub.write(batch * 1000, 1000, b"next")
    assert not future.done()
    gate.set()
    handle = future.result(timeout=30)
    assert handle.checkpoint_id == 1
    sub.store.close()
    restore_subtask(handle, storage, JobLayout(JOB), tmp_path / "r" / "db")
    restored = contents_of(tmp_path / "r" / "db")
    assert {v[:100] for v in restored.values()} == {b"a" * 100}, "state as of the barrier"
    sub.pool.shutdown()
