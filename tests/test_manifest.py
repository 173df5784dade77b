"""The `_metadata` manifest: round trip and validation of every field and path."""

from __future__ import annotations

import dataclasses
import json

import pytest

from state.handles import StateFile, SubtaskStateHandle
from state.keygroups import KeyGroupRange
from state.manifest import CheckpointManifest, ManifestError
from state.paths import JobLayout, PathEscapeError, check_relative


def manifest(**overrides) -> CheckpointManifest:
    h = SubtaskStateHandle(
        operator="count",
        subtask=0,
        key_group_range=KeyGroupRange(0, 127),
        checkpoint_id=4,
        files=(
            StateFile("000009.sst", "shared/count/0/000009-ab.sst", 100, "crc32:0000abcd"),
            StateFile("MANIFEST-000005", "chk-4/count/0/MANIFEST-000005", 7, "crc32:00000001"),
        ),
        uploaded_bytes=7,
    )
    fields = dict(
        job_id="clicks",
        checkpoint_id=4,
        batch_id=31,
        attempt=2,
        trigger_time_ms=1_700_000_000_000,
        source_positions={"log": {"0": 10, "1": 12}},
        sink_epochs={"delta": 31},
        subtasks=(h,),
    )
    fields.update(overrides)
    return CheckpointManifest(**fields)


def doc(m: CheckpointManifest) -> dict:
    return json.loads(m.to_json())


def test_round_trip_and_figures():
    m = manifest(epoch_ends={30: {"log": {"0": 9, "1": 11}}, 31: {"log": {"0": 10, "1": 12}}})
    back = CheckpointManifest.from_json(m.to_json())
    assert back == m
    assert back.epoch_ends[31] == {"log": {"0": 10, "1": 12}}
    assert (m.full_size, m.uploaded_bytes, m.file_count) == (107, 7, 2)
    assert m.shared_paths() == {"shared/count/0/000009-ab.sst"}
    assert m.referenced_paths() == {
        "shared/count/0/000009-ab.sst",
        "chk-4/count/0/MANIFEST-000005",
        "chk-4/_metadata",
        "chk-4/_claim",
    }


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(version=2), "version 2 is not supported"),
        (lambda d: d.pop("checkpoint_id"), "malformed"),
        (lambda d: d.update(batch_id="7"), "batch_id"),
        (lambda d: d.update(job_id="../other"), "escapes"),
        (lambda d: d["subtasks"][0]["files"][0].update(path="../../etc/passwd"), "escapes"),
        (lambda d: d["subtasks"][0]["files"][0].update(path="/etc/passwd"), "escapes"),
        (lambda d: d["subtasks"][0]["files"][0].update(path="shared/../../x"), "escapes"),
        (lambda d: d["subtasks"][0]["files"][0].update(local_name="a/b.sst"), "plain file name"),
        (lambda d: d["subtasks"][0]["files"][0].update(size=-1), "non-negative"),
        (lambda d: d["subtasks"][0]["files"][0].update(codec="gzip"), "codec of '000009.sst'"),
        (
            lambda d: d["subtasks"][0]["files"][0].update(codec="zstd", stored_size=True),
            "stored_size of '000009.sst' must be a non-negative integer",
        ),
        (
            lambda d: d["subtasks"][0]["files"][1].update(path="chk-3/count/0/MANIFEST-000005"),
            "private to this checkpoint",
        ),
        (lambda d: d["subtasks"].append(d["subtasks"][0]), "appears twice"),
    ],
)
def test_bad_manifests_are_rejected_with_a_clear_error(mutate, message):
    d = doc(manifest())
    mutate(d)
    with pytest.raises(ManifestError, match=message):
        CheckpointManifest.from_json(json.dumps(d), source="s3://b/clicks/chk-4/_metadata")


def test_a_compressed_files_stored_size_is_what_storage_holds():
    stored = StateFile(
        "000009.sst", "shared/count/0/000009-ab.sst", 100, "crc32:0000abcd", "zstd", 41
    )
    m = manifest(subtasks=(dataclasses.replace(manifest().subtasks[0], files=(stored,)),))
    back = CheckpointManifest.from_json(m.to_json())
    assert back == m and back.subtasks[0].files[0].stored_size == 41
    assert back.full_size == 41, "the bytes in durable storage"


def test_a_file_written_before_compression_reads_as_stored_as_it_is():
    d = doc(manifest())
    assert set(d["subtasks"][0]["files"][0]) == {"local_name", "path", "size", "checksum"}
    f = CheckpointManifest.from_json(json.dumps(d)).subtasks[0].files[0]
    assert (f.codec, f.stored_size) == ("none", 100)


def test_truncated_manifest_names_its_source():
    data = manifest().to_json()[:50]
    with pytest.raises(ManifestError, match="chk-4/_metadata: not valid JSON"):
        CheckpointManifest.from_json(data, source="chk-4/_metadata")


@pytest.mark.parametrize("bad", ["", "/a", "a/../b", "..", "a//b", "a\\b", "a/./b", "a\x00b"])
def test_check_relative_rejects_escaping_paths(bad):
    with pytest.raises(PathEscapeError):
        check_relative(bad)


def test_layout():
    layout = JobLayout("clicks")
    assert layout.job_path("chk-3/_metadata") == "clicks/chk-3/_metadata"
    assert layout.shared_file("count", 1, "x.sst") == "shared/count/1/x.sst"
    assert layout.private_file(3, "count", 1, "CURRENT") == "chk-3/count/1/CURRENT"
    assert JobLayout.checkpoint_id_of("chk-12/x") == 12
    assert JobLayout.checkpoint_id_of("shared/x") is None
    with pytest.raises(PathEscapeError):
        JobLayout("a/b")
