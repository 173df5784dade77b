"""Savepoints on real RocksDB and real storage (state/savepoint.py): written from a checkpoint,
moved to another prefix or bucket, checked, imported into another job and restored, with
the job's own files gone; and the damage they refuse.

``storage`` (tests/conftest.py) runs each test on the local filesystem and on moto's S3 server.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from state.keygroups import KeyGroupRange
from state.local_copies import LocalCopies
from state.manifest import CheckpointManifest
from state.paths import JobLayout, SavepointLayout
from state.restore import restore_subtask
from state.rocksdb_store import RocksDBStore
from state.savepoint import (
    SavepointError,
    SavepointRequest,
    delete_savepoint,
    import_savepoint,
    read_request,
    read_savepoint,
    write_request,
    write_savepoint,
)
from state.snapshot import SubtaskSnapshotter
from state.storage import DurableStorage, LocalFileStorage, MissingFileError, S3Storage
from tests.test_snapshot_restore import OPTS, Subtask, contents_of

JOB = "job1"
RANGE = KeyGroupRange(0, 63)


def beside(storage: DurableStorage, tmp_path, name: str) -> DurableStorage:
    """Another directory of the same kind of storage: a sibling directory, or a prefix in a
    fresh bucket on the same S3 server."""
    if isinstance(storage, LocalFileStorage):
        return LocalFileStorage(tmp_path / name)
    bucket = f"cutline-other-{uuid.uuid4().hex[:12]}"
    storage._client.create_bucket(Bucket=bucket)
    return S3Storage(bucket, f"moved/{name}", endpoint_url=storage._client.meta.endpoint_url)


def copy_tree(source: DurableStorage, target: DurableStorage) -> None:
    """What a person's copy of a directory does (``aws s3 cp --recursive``, ``cp -r``)."""
    for info in source.list():
        source.copy_to(info.path, target, info.path)


@pytest.fixture
def checkpoint(tmp_path, storage):
    """Checkpoint 2 of JOB (incremental on checkpoint 1) in ``storage``, and its contents."""
    sub = Subtask(tmp_path, storage, incremental=True, local_recovery=False)
    sub.write(0, 20_000, b"a" * 100)
    h1 = sub.snapshotter.snapshot(sub.store, 1, None).result()
    sub.write(0, 300, b"b" * 100)
    h2 = sub.snapshotter.snapshot(sub.store, 2, h1).result()
    expected = sub.contents()
    sub.store.close()
    sub.pool.shutdown()
    manifest = CheckpointManifest(JOB, 2, 9, 1, 0, {"clicks": {"0": 123}}, (h2,))
    storage.put_bytes(JobLayout(JOB).job_path(JobLayout(JOB).metadata(2)), manifest.to_json())
    return manifest, expected


def test_a_moved_savepoint_restores_into_another_job_with_the_original_gone(
    checkpoint, storage, tmp_path
):
    manifest, expected = checkpoint
    first = beside(storage, tmp_path, "sp-1")
    info = write_savepoint(manifest, storage, first)
    assert (info.checkpoint_id, info.batch_id, info.size) == (2, 9, manifest.full_size)
    moved = beside(storage, tmp_path, "sp-moved")
    copy_tree(first, moved)
    storage.delete_many([i.path for i in storage.list(JOB)])  # the job's GC took everything
    delete_savepoint(first)

    saved = read_savepoint(moved)
    assert saved.savepoint and saved.source_positions == {"clicks": {"0": 123}}
    imported = import_savepoint(saved, moved, storage, "job2", 5, attempt=3)
    assert (imported.job_id, imported.checkpoint_id, imported.attempt) == ("job2", 5, 3)
    assert not imported.savepoint and imported.batch_id == 9
    assert all(
        f.path.startswith("shared/") or f.path.startswith("chk-5/") for f in imported.files()
    )
    written = storage.get_bytes(JobLayout("job2").job_path(JobLayout("job2").metadata(5)))
    assert CheckpointManifest.from_json(written) == imported
    target = tmp_path / "restored" / "db"
    report = restore_subtask(imported.subtasks[0], storage, JobLayout("job2"), target)
    assert report.source == "remote"
    assert contents_of(target) == expected
    assert read_savepoint(moved) == saved  # importing takes nothing from it


def test_another_jobs_epochs_continue_where_its_sinks_are(checkpoint, storage, tmp_path):
    manifest, _ = checkpoint
    manifest = dataclasses.replace(manifest, sink_epochs={"out": 9}, epoch_ends={9: {}})
    target = beside(storage, tmp_path, "sp")
    write_savepoint(manifest, storage, target)
    imported = import_savepoint(read_savepoint(target), target, storage, "job2", 1, 1, batch_id=40)
    assert (imported.batch_id, imported.sink_epochs) == (40, {})
    assert imported.epoch_ends == {40: manifest.source_positions}


def test_a_missing_or_damaged_file_is_refused_naming_it(checkpoint, storage, tmp_path):
    manifest, _ = checkpoint
    target = beside(storage, tmp_path, "sp")
    write_savepoint(manifest, storage, target)
    sst = next(f for f in manifest.files() if f.shared)
    data = bytearray(target.get_bytes(sst.path))
    data[len(data) // 2] ^= 0xFF
    target.put_bytes(sst.path, bytes(data))
    with pytest.raises(SavepointError, match=f"{sst.path}: checksum mismatch"):
        read_savepoint(target)
    other = next(f for f in manifest.files() if f.path != sst.path)
    target.delete(other.path)
    with pytest.raises(SavepointError, match=f"missing {other.path}"):
        read_savepoint(target)


def test_what_is_not_a_savepoint_is_refused(checkpoint, storage, tmp_path):
    manifest, _ = checkpoint
    empty = beside(storage, tmp_path, "nothing")
    with pytest.raises(SavepointError, match=r"no savepoint at .*_metadata"):
        read_savepoint(empty)
    empty.put_bytes(SavepointLayout.METADATA, manifest.to_json())  # a checkpoint's manifest
    with pytest.raises(SavepointError, match="not a savepoint"):
        read_savepoint(empty)
    garbled = beside(storage, tmp_path, "garbled")
    garbled.put_bytes(SavepointLayout.METADATA, b"{not json")
    with pytest.raises(SavepointError, match="not valid JSON"):
        read_savepoint(garbled)


def test_a_savepoint_is_never_overwritten_and_deleting_leaves_nothing(
    checkpoint, storage, tmp_path
):
    manifest, _ = checkpoint
    target = beside(storage, tmp_path, "sp")
    write_savepoint(manifest, storage, target)
    with pytest.raises(SavepointError, match="already holds a savepoint"):
        write_savepoint(manifest, storage, target)
    assert delete_savepoint(target) == manifest.file_count + 1
    assert list(target.list()) == []
    with pytest.raises(SavepointError, match="no savepoint"):
        delete_savepoint(target)


@pytest.mark.s3
def test_copies_on_one_s3_server_never_pass_through_the_process(
    s3_server, s3_bucket, tmp_path, monkeypatch
):
    storage = S3Storage(s3_bucket, "ckpt", endpoint_url=s3_server, multipart_threshold=5 << 20)
    sub = Subtask(tmp_path, storage, incremental=True, local_recovery=False)
    sub.write(0, 20_000, b"c" * 100)
    handle = sub.snapshotter.snapshot(sub.store, 1, None).result()
    sub.store.close()
    sub.pool.shutdown()
    manifest = CheckpointManifest(JOB, 1, 1, 1, 0, {}, (handle,))

    def no_download(*args, **kwargs):
        raise AssertionError("a copy on one S3 server went through this process")

    monkeypatch.setattr(S3Storage, "get_file", no_download)
    target = beside(storage, tmp_path, "sp")
    write_savepoint(manifest, storage, target)
    monkeypatch.undo()
    assert read_savepoint(target).file_count == manifest.file_count


def test_requests_round_trip_and_bad_ones_are_named(storage):
    layout = JobLayout(JOB)
    assert read_request(storage, layout) is None
    request = SavepointRequest.new("s3://b/savepoints", True, 1)
    write_request(storage, layout, request)
    assert read_request(storage, layout) == request
    storage.put_bytes(layout.job_path("_requests/savepoint.json"), b'{"stop": "yes"}')
    with pytest.raises(SavepointError, match="not a valid savepoint request"):
        read_request(storage, layout)


def test_a_savepoint_of_a_local_copy_needs_no_remote_files(tmp_path):
    """The copy reads the checkpoint's files from durable storage, whatever local copies a
    subtask keeps (a savepoint must not depend on an executor's disk)."""
    storage = LocalFileStorage(tmp_path / "root")
    copies = LocalCopies(tmp_path / "local", JOB, "count", 0)
    store = RocksDBStore(copies.db_dir, RANGE, OPTS)
    snap = SubtaskSnapshotter(storage, copies, JOB, "count", 0, local_recovery=True)
    txn = store.begin()
    txn.put("v", [1], [b"k"], [b"v"])
    txn.commit()
    handle = snap.snapshot(store, 1, None).result()
    store.close()
    manifest = CheckpointManifest(JOB, 1, 1, 1, 0, {}, (handle,))
    storage.delete(JobLayout(JOB).job_path(handle.files[0].path))
    with pytest.raises(MissingFileError, match=handle.files[0].path):
        write_savepoint(manifest, storage, LocalFileStorage(tmp_path / "sp"))
