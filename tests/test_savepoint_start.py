"""Starting an attempt from a savepoint (spark_jobs/driver/savepoints.py ``start_from_savepoint``),
without Spark: hand-built savepoints of clicks_per_user on local storage, the in-memory catalog
and fake sinks of tests/test_attempt_start.py. What is imported, how the epochs continue, and
every bad input refused before anything is copied."""

from __future__ import annotations

import dataclasses
import zlib

import pytest
from cutline_examples.jobs import clicks_per_user

from spark_jobs.driver.savepoints import is_location, start_from_savepoint
from spark_jobs.errors import (
    ConfigurationError,
    IncompatibleStateError,
    NoRestorableCheckpointError,
)
from state.catalog import CheckpointStatus
from state.handles import StateFile, SubtaskStateHandle
from state.keygroups import key_group_range
from state.manifest import CheckpointManifest
from state.paths import JobLayout, SavepointLayout
from state.restore import read_manifest
from state.storage import LocalFileStorage
from tests.test_attempt_start import Catalog, FakeSink

JOB = clicks_per_user()
UID = JOB.operator.uid


class Registry(Catalog):
    """The test catalog, keeping the shared-file rows a start registers."""

    def __init__(self) -> None:
        super().__init__()
        self.shared: list[dict] = []

    def record_shared_files(self, rows: list[dict]) -> None:
        self.shared += rows


def saved(tmp_path, *, job_id: str = JOB.name, stages=None) -> tuple[str, CheckpointManifest]:
    """A savepoint directory of ``job_id``'s checkpoint 7 (batch 12) at parallelism 2: per
    subtask one shared SST file and one private file, with their true checksums."""
    target = LocalFileStorage(tmp_path / "sp")
    handles = []
    for i in range(2):
        files = []
        for name, path in ((f"00000{i}.sst", f"shared/{UID}/{i}/00000{i}-tok.sst"),
                           ("MANIFEST-1", f"chk-7/{UID}/{i}/MANIFEST-1.tok")):  # fmt: skip
            data = f"{name} of {i}".encode() * 10
            target.put_bytes(path, data)
            files.append(StateFile(name, path, len(data), f"crc32:{zlib.crc32(data):08x}"))
        kgs = key_group_range(i, 2, JOB.max_parallelism)
        handles.append(SubtaskStateHandle(UID, i, kgs, 7, tuple(files)))
    manifest = CheckpointManifest(
        job_id,
        7,
        12,
        3,
        0,
        {"clicks": {"0": 50, "1": 40}},
        tuple(handles),
        sink_epochs={"clicks_out": 12},
        savepoint=True,
        stages={UID: JOB.operator.state_schema()} if stages is None else stages,
    )
    target.put_bytes(SavepointLayout.METADATA, manifest.to_json())
    return str(target.root), manifest


def start(tmp_path, location, catalog, sinks, **kw) -> CheckpointManifest:
    storage = LocalFileStorage(tmp_path / "checkpoints")
    attempt = catalog.begin_attempt(JOB.name)
    return start_from_savepoint(
        catalog, storage, JOB, sinks, location, attempt, lambda _: None, **kw
    )


def test_locations_are_told_from_latest_and_ids():
    assert is_location("/tmp/sp") and is_location("s3://b/sp") and is_location("file:///sp")
    assert not any(is_location(x) for x in ("latest", "12", None, 12))


def test_a_savepoint_of_the_job_becomes_its_next_checkpoint(tmp_path):
    location, manifest = saved(tmp_path)
    catalog, sinks = Registry(), [FakeSink("clicks_out", committed=15)]
    catalog.commit_checkpoint(
        dataclasses.replace(_row(manifest, 30), job_id=JOB.name, status=CheckpointStatus.SUBSUMED)
    )
    imported = start(tmp_path, location, catalog, sinks)
    assert (imported.job_id, imported.checkpoint_id, imported.attempt) == (JOB.name, 31, 1)
    # its own history: the epochs its sinks committed after the savepoint are replayed
    assert imported.batch_id == 12 and imported.sink_epochs == {"clicks_out": 12}
    assert not imported.savepoint
    assert catalog.checkpoints(JOB.name, (CheckpointStatus.COMPLETED,))[-1].checkpoint_id == 31
    storage = LocalFileStorage(tmp_path / "checkpoints")
    layout = JobLayout(JOB.name)
    assert read_manifest(storage, layout.job_path(layout.metadata(31))) == imported
    for f in imported.files():  # every file copied under a fresh name
        assert storage.stat(layout.job_path(f.path)).size == f.size
    assert sorted(r["path"] for r in catalog.shared) == sorted(imported.shared_paths())


def test_another_jobs_savepoint_starts_another_history(tmp_path):
    location, _ = saved(tmp_path, job_id="clicks_elsewhere")
    catalog = Registry()
    sinks = [FakeSink("clicks_out", output=5, committed=20)]
    with pytest.raises(ConfigurationError, match=r"savepoint of clicks_elsewhere.*--reset-sink"):
        start(tmp_path, location, catalog, sinks)
    assert sinks[0].output == 5 and catalog.checkpoints(JOB.name) == []
    imported = start(tmp_path, location, catalog, sinks, reset_sink=True)
    assert ("reset",) in sinks[0].calls
    # epochs continue above the ones its sinks committed; the first records the savepoint's cut
    assert imported.batch_id == 20 and imported.sink_epochs == {}
    assert imported.epoch_ends == {20: {"clicks": {"0": 50, "1": 40}}}


def test_a_missing_or_damaged_file_is_refused_naming_it_and_nothing_is_imported(tmp_path):
    location, manifest = saved(tmp_path)
    victim = manifest.subtasks[1].files[0]
    path = tmp_path / "sp" / victim.path
    path.write_bytes(path.read_bytes()[::-1])  # same size: only the checksum tells
    catalog = Registry()
    with pytest.raises(NoRestorableCheckpointError, match=f"{victim.path}: checksum mismatch"):
        start(tmp_path, location, catalog, [FakeSink("clicks_out")])
    path.unlink()
    with pytest.raises(NoRestorableCheckpointError, match=f"missing {victim.path}"):
        start(tmp_path, location, catalog, [FakeSink("clicks_out")])
    assert catalog.checkpoints(JOB.name) == []
    assert not (tmp_path / "checkpoints" / JOB.name / "shared").exists()


def test_a_savepoint_of_other_state_is_refused_naming_the_stage_and_the_state(tmp_path):
    other = {UID: {"aggregates": "keyed-aggregate<clicks=sum(x)>/v1"}}
    location, _ = saved(tmp_path, stages=other)
    with pytest.raises(
        IncompatibleStateError,
        match=rf"savepoint {location} \(of clicks_per_user\): stage 'count_by_user' .*state "
        "'aggregates' was stored",
    ):
        start(tmp_path, location, Registry(), [FakeSink("clicks_out")])


def test_a_refused_savepoint_start_names_the_savepoints_job_and_creates_nothing(tmp_path):
    """``cutline run JOB --restore LOCATION`` of another job's savepoint whose stage this job
    does not have: exit 2 naming the savepoint's own job and checkpoint, before an attempt, a
    catalog, a sink table or a JVM exists."""
    from spark_jobs.commands.main import main

    location, _ = saved(tmp_path, job_id="my_sessions", stages={"sessionize": {}})
    home = tmp_path / "home"
    home.mkdir()
    code = main(["run", "clicks_per_user", "--restore", location, "--home", str(home)])
    assert code == 2
    assert list(home.iterdir()) == [], "a refused start creates nothing"


def test_what_is_no_savepoint_is_refused(tmp_path):
    with pytest.raises(NoRestorableCheckpointError, match=r"no savepoint at .* no _metadata"):
        start(tmp_path, str(tmp_path / "nothing"), Registry(), [FakeSink("clicks_out")])


def _row(manifest: CheckpointManifest, checkpoint_id: int):
    from state.catalog import CompletedCheckpoint

    return CompletedCheckpoint.from_manifest(
        dataclasses.replace(manifest, checkpoint_id=checkpoint_id, savepoint=False), 1
    )
