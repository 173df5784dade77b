"""Tests of state.storage over both backends (local directory and moto S3)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

import state.storage.local as storage_mod
from state.paths import PathEscapeError
from state.storage import (
    AccessError,
    AlreadyExistsError,
    CorruptFileError,
    DurableStorage,
    LocalFileStorage,
    MissingFileError,
    ObjectInfo,
    S3Storage,
    StorageError,
    open_storage,
)
from tests.s3_proxy import FAIL, LOSE, PASS, FaultyProxy, first_failing

MiB = 2**20
BAD_PATHS = ["../x", "/abs", "a//b", "a/../b", "", "a/./b", "a\\b"]


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".tmp-"))


# --- round trips --------------------------------------------------------------------------------


def test_bytes_round_trip_and_overwrite(storage: DurableStorage) -> None:
    storage.put_bytes("job/chk-1/_metadata", b"first version")
    assert storage.get_bytes("job/chk-1/_metadata") == b"first version"
    storage.put_bytes("job/chk-1/_metadata", b"v2")
    assert storage.get_bytes("job/chk-1/_metadata", expected_size=2) == b"v2"
    assert storage.stat("job/chk-1/_metadata").size == 2
    storage.put_bytes("empty", b"")
    assert storage.get_bytes("empty", expected_size=0) == b""


def test_file_round_trip_small_and_multipart(storage: DurableStorage, tmp_path: Path) -> None:
    for name, size in [("small.sst", 1234), ("big.sst", 6 * MiB + 17)]:
        src = tmp_path / name
        data = os.urandom(size)
        src.write_bytes(data)
        assert storage.put_file(src, f"shared/op/0/{name}") == size
        dest = tmp_path / "restore" / "deep" / name
        assert storage.get_file(f"shared/op/0/{name}", dest, expected_size=size) == size
        assert dest.read_bytes() == data
        assert storage.get_bytes(f"shared/op/0/{name}") == data
        assert _leftovers(dest.parent) == []


def test_get_file_overwrites_local_copy(storage: DurableStorage, tmp_path: Path) -> None:
    storage.put_bytes("f", b"new content")
    dest = tmp_path / "f"
    dest.write_bytes(b"stale local content that is longer")
    assert storage.get_file("f", dest) == len(b"new content")
    assert dest.read_bytes() == b"new content"


def test_stat_exists_and_list(storage: DurableStorage) -> None:
    before = time.time()
    files = {"a/1": 1, "a/b/2": 2, "ab/3": 3, "c": 4, "a.z": 5, "a-x/6": 6}
    for path, size in files.items():
        storage.put_bytes(path, b"x" * size)
    everything = list(storage.list())
    assert [(i.path, i.size) for i in everything] == sorted(files.items())
    for info in everything:
        assert isinstance(info, ObjectInfo)
        assert before - 120 < info.modified < time.time() + 120
    assert [i.path for i in storage.list("a")] == ["a/1", "a/b/2"]
    assert [(i.path, i.size) for i in storage.list("a/b")] == [("a/b/2", 2)]
    assert list(storage.list("zzz")) == []
    assert list(storage.list("c")) == []  # a file is not a directory
    info = storage.stat("a/b/2")
    assert (info.path, info.size) == ("a/b/2", 2)
    assert storage.exists("a/b/2") and storage.exists("c")
    assert not storage.exists("a/b")  # directories are not files
    assert not storage.exists("nope")


def test_delete_is_idempotent(storage: DurableStorage) -> None:
    storage.put_bytes("d/x", b"1")
    storage.put_bytes("d/y", b"2")
    assert storage.delete("d/x") is True
    assert storage.delete("d/x") is False
    assert not storage.exists("d/x")
    assert [i.path for i in storage.list()] == ["d/y"]


def test_delete_many(storage: DurableStorage) -> None:
    paths = [f"chk-{n}/op/0/f{k}" for n in range(3) for k in range(4)]
    for p in paths:
        storage.put_bytes(p, p.encode())
    assert storage.delete_many(p for p in paths if p.startswith("chk-1/")) == 4
    assert [i.path for i in storage.list()] == [p for p in paths if not p.startswith("chk-1/")]
    assert storage.delete_many([*paths, *paths]) >= 8  # duplicates and missing are fine
    assert list(storage.list()) == []
    assert storage.delete_many([]) == 0


def test_missing_file_errors_name_path_and_url(storage: DurableStorage, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    calls = [
        lambda: storage.get_bytes("no/such/file"),
        lambda: storage.get_file("no/such/file", dest),
        lambda: storage.stat("no/such/file"),
    ]
    for call in calls:
        with pytest.raises(MissingFileError) as excinfo:
            call()
        assert "no/such/file" in str(excinfo.value)
        assert storage.url in str(excinfo.value)
        assert excinfo.value.path == "no/such/file"
    assert not dest.exists()
    assert _leftovers(tmp_path) == []


def test_size_mismatch_is_corrupt(storage: DurableStorage, tmp_path: Path) -> None:
    storage.put_bytes("chk-1/_metadata", b"0123456789")
    with pytest.raises(CorruptFileError) as excinfo:
        storage.get_bytes("chk-1/_metadata", expected_size=11)
    message = str(excinfo.value)
    assert "chk-1/_metadata" in message and "11" in message and "10" in message
    assert (excinfo.value.expected, excinfo.value.actual) == (11, 10)

    dest = tmp_path / "meta"
    with pytest.raises(CorruptFileError, match="chk-1/_metadata"):
        storage.get_file("chk-1/_metadata", dest, expected_size=9)
    assert not dest.exists(), "a corrupt download must not land at local_path"
    assert _leftovers(tmp_path) == []
    assert issubclass(CorruptFileError, StorageError)
    assert issubclass(MissingFileError, StorageError)


def test_path_escape_rejected(storage: DurableStorage, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"payload")
    storage.put_bytes("keep", b"k")
    for bad in BAD_PATHS:
        calls = [
            lambda bad=bad: storage.put_file(src, bad),
            lambda bad=bad: storage.put_bytes(bad, b"x"),
            lambda bad=bad: storage.get_file(bad, tmp_path / "dest"),
            lambda bad=bad: storage.get_bytes(bad),
            lambda bad=bad: storage.exists(bad),
            lambda bad=bad: storage.stat(bad),
            lambda bad=bad: storage.delete(bad),
            lambda bad=bad: storage.delete_many(["keep", bad]),
        ]
        if bad:  # "" is the whole root for list()
            calls.append(lambda bad=bad: list(storage.list(bad)))
        for call in calls:
            with pytest.raises(PathEscapeError):
                call()
    assert [i.path for i in storage.list()] == ["keep"]
    assert not (tmp_path / "dest").exists()
    assert not (tmp_path / "x").exists()


class _Tripwire:
    """An S3 client stand-in that fails the test if anything touches it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"S3 client used ({name}) before the path was checked")


def test_path_escape_checked_before_any_s3_call(tmp_path: Path) -> None:
    s3 = S3Storage("bucket", "pre", client=_Tripwire())
    src = tmp_path / "src"
    src.write_bytes(b"x")
    for bad in ["../x", "/abs", "a//b"]:
        for call in [
            lambda bad=bad: s3.put_file(src, bad),
            lambda bad=bad: s3.put_bytes(bad, b"x"),
            lambda bad=bad: s3.get_file(bad, tmp_path / "d"),
            lambda bad=bad: s3.get_bytes(bad),
            lambda bad=bad: s3.exists(bad),
            lambda bad=bad: s3.stat(bad),
            lambda bad=bad: s3.delete(bad),
            lambda bad=bad: s3.delete_many(["fine", bad]),
            lambda bad=bad: list(s3.list(bad)),
        ]:
            with pytest.raises(PathEscapeError):
                call()


def test_local_root_untouched_by_escapes(tmp_path: Path) -> None:
    local = LocalFileStorage(tmp_path / "root")
    for bad in ["../x", "/abs", "a//b"]:
        with pytest.raises(PathEscapeError):
            local.put_bytes(bad, b"x")
    assert not (tmp_path / "root").exists()
    assert not (tmp_path / "x").exists()


# --- local specifics ----------------------------------------------------------------------------


def test_local_layout_and_url(tmp_path: Path) -> None:
    local = LocalFileStorage(tmp_path / "root")
    assert local.url == "file://" + str(tmp_path / "root")
    local.put_bytes("job/chk-3/_metadata", b"m")
    assert (tmp_path / "root" / "job" / "chk-3" / "_metadata").read_bytes() == b"m"
    assert _leftovers(tmp_path / "root" / "job" / "chk-3") == []


def test_local_put_failing_midway_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = LocalFileStorage(tmp_path / "root")
    src = tmp_path / "src"
    src.write_bytes(b"n" * 100_000)

    def copy_half_then_fail(source: Any, dest: Any) -> int:
        dest.write(source.read(50_000))
        dest.flush()
        raise OSError("source device went away")

    monkeypatch.setattr(storage_mod, "_copy_stream", copy_half_then_fail)
    with pytest.raises(StorageError, match="a/new") as excinfo:
        local.put_file(src, "a/new")
    assert local.url in str(excinfo.value)
    assert not local.exists("a/new")
    assert [i.path for i in local.list()] == []

    # An overwrite that fails midway keeps the old content.
    monkeypatch.undo()
    local.put_bytes("a/old", b"old content")
    monkeypatch.setattr(storage_mod, "_copy_stream", copy_half_then_fail)
    with pytest.raises(StorageError):
        local.put_file(src, "a/old")
    assert local.get_bytes("a/old") == b"old content"
    assert [i.path for i in local.list()] == ["a/old"]


def test_local_put_failing_at_fsync_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = LocalFileStorage(tmp_path / "root")
    local.put_bytes("f", b"old")

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StorageError, match="'f'"):
        local.put_bytes("f", b"new content")
    monkeypatch.undo()
    assert local.get_bytes("f") == b"old"
    assert [i.path for i in local.list()] == ["f"]


def test_unreadable_source_is_storage_error(storage: DurableStorage, tmp_path: Path) -> None:
    for source in [tmp_path / "missing", tmp_path]:  # absent, and a directory
        with pytest.raises(StorageError, match="target/x"):
            storage.put_file(source, "target/x")
    assert not storage.exists("target/x")
    assert list(storage.list()) == []


def test_local_reader_never_sees_partial_file(tmp_path: Path) -> None:
    local = LocalFileStorage(tmp_path / "root")
    versions = [b"a" * (2 * MiB), b"b" * (3 * MiB)]
    src_files = []
    for n, data in enumerate(versions):
        src = tmp_path / f"v{n}"
        src.write_bytes(data)
        src_files.append(src)
    local.put_bytes("hot", versions[0])
    target = tmp_path / "root" / "hot"
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for n in range(40):
                if n % 2:
                    local.put_file(src_files[n % 2], "hot")
                else:
                    local.put_bytes("hot", versions[n % 2])
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    while not stop.is_set():
        data = target.read_bytes()
        reads += 1
        assert data in versions, f"reader saw a partial file of {len(data)} bytes"
    thread.join()
    assert not errors
    assert reads > 0
    assert _leftovers(target.parent) == []


def test_local_delete_prunes_empty_dirs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    local = LocalFileStorage(root)
    local.put_bytes("a/b/c/f", b"1")
    local.put_bytes("a/g", b"2")
    assert local.delete("a/b/c/f")
    assert not (root / "a" / "b").exists()
    assert (root / "a").is_dir()
    assert local.delete_many(["a/g", "a/g", "missing"]) == 1
    assert not (root / "a").exists()
    assert root.is_dir()


def test_local_list_survives_concurrent_deletes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    local = LocalFileStorage(root)
    for p in ["keep/1", "gone-file/1", "gone-file/2", "gone-dir/sub/1", "z"]:
        local.put_bytes(p, b"x")
    real_scandir = os.scandir

    class Racy:
        """Lists a directory, then deletes some entries before the caller stats them."""

        def __init__(self, path: Any) -> None:
            self.entries = list(real_scandir(path))
            for entry in self.entries:
                if entry.name == "2" or entry.name == "sub":
                    victim = Path(entry.path)
                    if victim.is_dir():
                        (victim / "1").unlink()
                        victim.rmdir()
                    else:
                        victim.unlink()

        def __enter__(self) -> Iterator[Any]:
            return iter(self.entries)

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(os, "scandir", Racy)
    paths = [i.path for i in local.list()]
    monkeypatch.undo()
    assert paths == ["gone-file/1", "keep/1", "z"]


# --- S3 specifics -------------------------------------------------------------------------------


@pytest.mark.s3
def test_s3_multipart_and_prefix_isolation(s3_server: str, s3_bucket: str, tmp_path: Path) -> None:
    raw = boto3.client("s3", endpoint_url=s3_server)
    s3 = S3Storage(s3_bucket, "/jobs/", endpoint_url=s3_server, multipart_threshold=5 * MiB)
    assert s3.url == f"s3://{s3_bucket}/jobs"
    src = tmp_path / "big"
    data = os.urandom(6 * MiB)
    src.write_bytes(data)
    assert s3.put_file(src, "shared/big.sst") == len(data)
    head = raw.head_object(Bucket=s3_bucket, Key="jobs/shared/big.sst")
    assert head["ETag"].strip('"').endswith("-2"), "expected a 2-part multipart upload"
    assert head["ContentLength"] == len(data)
    s3.put_bytes("small", b"s")
    assert raw.get_object(Bucket=s3_bucket, Key="jobs/small")["Body"].read() == b"s"

    raw.put_object(Bucket=s3_bucket, Key="jobsx/not-mine", Body=b"1")
    raw.put_object(Bucket=s3_bucket, Key="other/not-mine", Body=b"1")
    assert [i.path for i in s3.list()] == ["shared/big.sst", "small"]
    whole = S3Storage(s3_bucket, endpoint_url=s3_server)
    assert [i.path for i in whole.list("jobs")] == ["jobs/shared/big.sst", "jobs/small"]


@pytest.mark.s3
def test_s3_other_client_errors_are_storage_errors(s3_server: str) -> None:
    s3 = S3Storage("cutline-no-such-bucket", "p", endpoint_url=s3_server, max_attempts=1)
    with pytest.raises(StorageError) as excinfo:
        s3.put_bytes("a/b", b"x")
    assert not isinstance(excinfo.value, MissingFileError)
    message = str(excinfo.value)
    assert "a/b" in message and "s3://cutline-no-such-bucket/p" in message
    assert "NoSuchBucket" in message


class _RecordingClient:
    def __init__(self, fail_keys: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.batches: list[list[str]] = []
        self.fail_keys = fail_keys

    def delete_objects(self, *, Bucket: str, Delete: dict[str, Any]) -> dict[str, Any]:
        keys = [o["Key"] for o in Delete["Objects"]]
        self.batches.append(keys)
        errors = [{"Key": k, "Code": "AccessDenied"} for k in keys if k in self.fail_keys]
        return {"Errors": errors} if errors else {}


def test_s3_delete_many_batches_by_1000() -> None:
    client = _RecordingClient()
    s3 = S3Storage("bucket", "pre", client=client)
    paths = [f"f/{n}" for n in range(2500)]
    assert s3.delete_many(paths + paths[:10]) == 2500
    assert [len(b) for b in client.batches] == [1000, 1000, 500]
    assert client.batches[0][0] == "pre/f/0"
    assert sorted(k for b in client.batches for k in b) == sorted(f"pre/{p}" for p in paths)

    failing = _RecordingClient({"pre/f/1500"})
    s3 = S3Storage("bucket", "pre", client=failing)
    with pytest.raises(StorageError, match=r"f/1500.*AccessDenied") as excinfo:
        s3.delete_many(paths)
    assert "s3://bucket/pre" in str(excinfo.value)
    assert len(failing.batches) == 3  # the remaining batches were still attempted


# --- retries through a faulty proxy -------------------------------------------------------------


@pytest.fixture
def faulty_proxy(s3_server: str) -> Iterator[FaultyProxy]:
    with FaultyProxy(s3_server, first_failing(2)) as proxy:
        yield proxy


@pytest.mark.s3
def test_s3_retries_transient_errors(faulty_proxy: FaultyProxy, s3_bucket: str) -> None:
    s3 = S3Storage(s3_bucket, "p", endpoint_url=faulty_proxy.url)
    s3.put_bytes("chk-1/_metadata", b"survives two 503s")
    assert s3.get_bytes("chk-1/_metadata") == b"survives two 503s"
    faults = [fault for _, _, fault in faulty_proxy.seen]
    assert faults[:2] == [FAIL, FAIL] and FAIL not in faults[2:]
    # The two failures and the success are the same PUT, retried by botocore.
    assert {(m, p.split("?")[0]) for m, p, _ in faulty_proxy.seen[:3]} == {
        ("PUT", f"/{s3_bucket}/p/chk-1/_metadata")
    }
    assert len(faulty_proxy.seen) == 4  # 3 PUT attempts + 1 GET


@pytest.mark.s3
def test_an_exclusive_put_whose_answer_was_lost_is_its_own_on_the_retry(
    s3_server: str, s3_bucket: str
) -> None:
    """The first PUT stores the claim but its answer is lost (503); botocore's retry finds the
    object (412): the same bytes are this writer's own, so the claim succeeded. Another
    writer's bytes at the path stay a refusal."""
    with FaultyProxy(s3_server, first_failing(1, LOSE)) as proxy:
        s3 = S3Storage(s3_bucket, "p", endpoint_url=proxy.url)
        s3.put_bytes("job/claims/chk-7", b'{"attempt": 3}', exclusive=True)
        assert [fault for m, _, fault in proxy.seen if m == "PUT"] == [LOSE, PASS]
        assert s3.get_bytes("job/claims/chk-7") == b'{"attempt": 3}'
        with pytest.raises(AlreadyExistsError, match="chk-7"):
            s3.put_bytes("job/claims/chk-7", b'{"attempt": 4}', exclusive=True)


@pytest.mark.s3
def test_s3_without_retries_surfaces_storage_error(
    faulty_proxy: FaultyProxy, s3_bucket: str
) -> None:
    s3 = S3Storage(s3_bucket, "p", endpoint_url=faulty_proxy.url, max_attempts=1)
    with pytest.raises(StorageError) as excinfo:
        s3.put_bytes("chk-1/_metadata", b"lost")
    message = str(excinfo.value)
    assert "chk-1/_metadata" in message and s3.url in message and "SlowDown" in message
    assert not isinstance(excinfo.value, MissingFileError)
    assert len(faulty_proxy.seen) == 1  # no retry


# --- open_storage -------------------------------------------------------------------------------


def test_open_storage_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    by_url = open_storage(f"file://{tmp_path}/ckpt")
    assert isinstance(by_url, LocalFileStorage)
    assert by_url.root == tmp_path / "ckpt"
    assert by_url.url == f"file://{tmp_path}/ckpt"
    by_path = open_storage(str(tmp_path / "ckpt"))
    assert isinstance(by_path, LocalFileStorage) and by_path.root == tmp_path / "ckpt"
    monkeypatch.chdir(tmp_path)
    relative = open_storage("rel/dir")
    assert isinstance(relative, LocalFileStorage) and relative.root == tmp_path / "rel" / "dir"
    spaced = LocalFileStorage(tmp_path / "with space")
    assert open_storage(spaced.url).root == spaced.root  # url round trip (percent-encoded)


def test_open_storage_s3_parsing() -> None:
    s3 = open_storage("s3://my-bucket/some/prefix/", endpoint_url="http://127.0.0.1:9")
    assert isinstance(s3, S3Storage)
    assert (s3.bucket, s3.prefix, s3.url) == (
        "my-bucket",
        "some/prefix",
        "s3://my-bucket/some/prefix",
    )
    bare = open_storage("s3://my-bucket")
    assert isinstance(bare, S3Storage)
    assert (bare.bucket, bare.prefix, bare.url) == ("my-bucket", "", "s3://my-bucket")
    assert open_storage("s3://my-bucket/").prefix == ""  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "url",
    [
        "gs://bucket/x",
        "http://host/x",
        "s3://",
        "s3:///prefix",
        "file://otherhost/x",
        "s3:bucket",
        "",
        "s3://bucket/x?versionId=1",
        "file:relative",
    ],
)
def test_open_storage_rejects_other_urls(url: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        open_storage(url)
    assert repr(url) in str(excinfo.value)


@pytest.mark.s3
def test_open_storage_s3_endpoint(
    s3_server: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    explicit = open_storage(f"s3://{s3_bucket}/a", endpoint_url=s3_server)
    explicit.put_bytes("x", b"1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)  # boto3's own fallback
    from_env = open_storage(f"s3://{s3_bucket}")
    assert [(i.path, i.size) for i in from_env.list()] == [("a/x", 1)]
    assert from_env.get_bytes("a/x") == b"1"


def test_exclusive_put_refuses_to_replace(storage):
    from state.storage import AlreadyExistsError

    storage.put_bytes("job/chk-1/_metadata", b"first", exclusive=True)
    with pytest.raises(AlreadyExistsError, match="chk-1/_metadata"):
        storage.put_bytes("job/chk-1/_metadata", b"second", exclusive=True)
    assert storage.get_bytes("job/chk-1/_metadata") == b"first"
    # the same bytes again: the writer's own earlier try (its answer lost), not another's
    storage.put_bytes("job/chk-1/_metadata", b"first", exclusive=True)
    assert [i.path for i in storage.list("job")] == ["job/chk-1/_metadata"], "no temp file left"


# --- a storage that refuses this process ---------------------------------------------------------


@pytest.mark.s3
def test_a_missing_bucket_is_an_access_error_not_a_missing_file(s3_server: str) -> None:
    s3 = S3Storage("no-such-bucket-here", "chk", endpoint_url=s3_server)
    with pytest.raises(AccessError, match="NoSuchBucket") as refused:
        s3.probe()
    assert "s3://no-such-bucket-here/chk" in str(refused.value)
    with pytest.raises(AccessError):
        s3.get_bytes("job/chk-1/_metadata")  # not MissingFileError: nothing would mark it lost


@pytest.mark.parametrize("code", ["AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"])
def test_denied_access_and_bad_credentials_are_access_errors(code: str) -> None:
    from botocore.exceptions import ClientError

    class Refusing:
        def list_objects_v2(self, **kwargs: Any) -> None:
            error = {"Error": {"Code": code, "Message": "no"}, "ResponseMetadata": {}}
            raise ClientError(error, "ListObjectsV2")

    with pytest.raises(AccessError, match=code):
        S3Storage("bucket", "p", client=Refusing()).probe()


def test_an_unwritable_local_root_is_an_access_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the root's parent should be")
    with pytest.raises(AccessError, match="cannot create"):
        LocalFileStorage(blocker / "root").probe()
    LocalFileStorage(tmp_path / "fine").probe()
    assert (tmp_path / "fine").is_dir()
