"""The driver's side of a completed or aborted checkpoint (spark_jobs/driver/completion.py),
without Spark: fake sinks and a fake catalog writer, real run state, epoch ends, compaction and
savepoint requests (spark_jobs/driver/savepoints.py) and local storage."""

from __future__ import annotations

import zlib
from types import SimpleNamespace

from spark_jobs.driver.barrier import CompactionRequests
from spark_jobs.driver.completion import Completion
from spark_jobs.driver.epoch_ends import EpochEnds
from spark_jobs.driver.run_state import RunState
from spark_jobs.driver.savepoints import SavepointRequests
from state.catalog import CompletedCheckpoint
from state.compaction import CompactionRequest, read_request, write_request
from state.handles import StateFile, SubtaskStateHandle
from state.keygroups import KeyGroupRange
from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.savepoint import (
    SAVEPOINT_WRITING,
    SavepointRequest,
    note_writing,
    read_savepoint,
    write_savepoint,
)
from state.savepoint import read_request as pending_savepoint
from state.savepoint import write_request as ask_savepoint
from state.storage import DurableStorage, LocalFileStorage, open_storage

JOB = "clicks"


class FakeSink:
    """Records each commit; ``fail`` makes the next one raise."""

    def __init__(self, name: str, rows: int = 5) -> None:
        self.sink, self.rows = name, rows
        self.commits: list[tuple[int, dict, dict | None]] = []
        self.fail: Exception | None = None

    def commit_through(self, epoch, ends, *, staged_by=None, times=None) -> int:
        if self.fail is not None:
            raise self.fail
        self.commits.append((epoch, dict(ends), times))
        return self.rows


class FakeCatalogWriter:
    """The writer methods completion uses of the Delta catalog."""

    def __init__(self) -> None:
        self.shared: list[list[dict]] = []
        self.recorded: list[dict] = []  # savepoints rows

    def record_shared_files(self, rows: list[dict]) -> None:
        self.shared.append(rows)

    def record_savepoint(self, row: dict) -> None:
        self.recorded.append(row)

    def savepoints(self, job_id: str) -> list[dict]:
        return [r for r in self.recorded if r["job_id"] == job_id]


class Events:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict]] = []

    def emit(self, kind: str, payload: dict) -> None:
        self.emitted.append((kind, payload))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.emitted]


def contents(size: int) -> bytes:
    """A file's bytes as Rig.stored writes them."""
    return b"x" * size


def crc(size: int) -> str:
    return f"crc32:{zlib.crc32(contents(size)):08x}"


def handle(cid: int, subtask: int, shared: list[str], private: int = 1) -> SubtaskStateHandle:
    files = tuple(
        StateFile(f"{name}.sst", f"shared/count/{subtask}/{name}.sst", 100, crc(100))
        for name in shared
    ) + tuple(
        StateFile(f"MANIFEST-{i}", f"chk-{cid}/count/{subtask}/MANIFEST-{i}", 7, crc(7))
        for i in range(private)
    )
    return SubtaskStateHandle(
        operator="count",
        subtask=subtask,
        key_group_range=KeyGroupRange(subtask * 64, subtask * 64 + 63),
        checkpoint_id=cid,
        files=files,
        uploaded_bytes=7,
    )


def manifest(cid: int, batch: int, shared: dict[int, list[str]], **fields) -> CheckpointManifest:
    return CheckpointManifest(
        job_id=JOB,
        checkpoint_id=cid,
        batch_id=batch,
        attempt=1,
        trigger_time_ms=1_700_000_000_000,
        source_positions={"log": {"0": batch * 10}},
        subtasks=tuple(handle(cid, s, names) for s, names in sorted(shared.items())),
        **fields,
    )


def record(m: CheckpointManifest) -> CompletedCheckpoint:
    return CompletedCheckpoint.from_manifest(m, 1_700_000_000_500)


class Rig:
    def __init__(self, tmp_path, *, exactly_once=True, restored=None, sinks=None) -> None:
        self.storage = LocalFileStorage(str(tmp_path / "root"))
        self.layout = JobLayout(JOB)
        self.state, self.events, self.lines = RunState(), Events(), []
        self.ends, self.catalog = EpochEnds(), FakeCatalogWriter()
        self.sinks = sinks if sinks is not None else [FakeSink("main", 5), FakeSink("audit", 3)]
        self.compaction = CompactionRequests(
            self.storage, self.layout, 2, self.state, self.lines.append, self.events
        )
        self.savepoints = SavepointRequests(
            SimpleNamespace(name=JOB, version="v7", parallelism=2),
            self.storage,
            self.catalog,
            str(tmp_path / "savepoints"),
            self.state,
            self.lines.append,
            self.events,
        )
        self.completion = Completion(
            JOB,
            self.sinks,
            self.catalog,
            self.ends,
            self.compaction,
            self.savepoints,
            self.state,
            restored,
            exactly_once=exactly_once,
            log=self.lines.append,
            events=self.events,
        )

    def complete(self, m: CheckpointManifest) -> None:
        self.completion.on_checkpoint_complete(record(m), m)

    def left_whole(self, tmp_path, request: SavepointRequest) -> DurableStorage:
        """An earlier attempt wrote ``request``'s savepoint of checkpoint 1 whole, noted where,
        and died before recording it; the request is pending."""
        whole = open_storage(str(tmp_path / "sp" / f"savepoint-1-{request.request_id}"))
        write_savepoint(self.stored(manifest(1, 3, {0: ["a-t1"]})), self.storage, whole)
        ask_savepoint(self.storage, self.layout, request)
        note_writing(self.storage, self.layout, request.request_id, whole.url)
        return whole

    def stored(self, m: CheckpointManifest) -> CheckpointManifest:
        """``m`` with its files in storage (a savepoint copies them)."""
        for f in m.files():
            self.storage.put_bytes(self.layout.job_path(f.path), contents(f.size))
        return m


def uncommitted(ends: EpochEnds) -> set[int]:
    return set(ends.record(10_000, {})) - {10_000}


def test_exactly_once_sinks_commit_their_epochs_and_the_ends_are_forgotten(tmp_path):
    rig = Rig(tmp_path)
    for epoch in (5, 6, 7, 8):
        rig.ends.record(epoch, {"log": {"0": epoch * 10}}, processing_time=epoch * 1000)
    ends = {6: {"log": {"0": 60}}, 7: {"log": {"0": 70}}}
    m = manifest(
        3,
        7,
        {0: ["a-t3"]},
        sink_epochs={"main": 7},  # "audit" staged nothing in this checkpoint
        epoch_ends=ends,
        epoch_times={6: 6000, 7: 7000},
    )
    rig.complete(m)
    main, audit = rig.sinks
    assert main.commits == [(7, ends, {6: 6000, 7: 7000})]
    assert audit.commits == []
    assert uncommitted(rig.ends) == {8}, "the epochs through the checkpoint's batch forgotten"
    assert rig.state.checkpoints == [3] and not rig.state.failed
    assert "sink rows committed 5" in rig.lines[-1]
    [(kind, payload)] = rig.events.emitted
    assert kind == "checkpoint" and payload["checkpoint_id"] == 3


def test_only_the_first_sinks_rows_are_reported(tmp_path):
    rig = Rig(tmp_path)
    rig.complete(manifest(1, 2, {0: []}, sink_epochs={"main": 2, "audit": 2}))
    assert [len(s.commits) for s in rig.sinks] == [1, 1]
    assert "sink rows committed 5" in rig.lines[-1]


def test_a_failed_sink_commit_fails_the_attempt_and_nothing_after_it_happens(tmp_path):
    rig = Rig(tmp_path)
    rig.ends.record(4, {"log": {"0": 40}})
    write_request(rig.storage, rig.layout, CompactionRequest((), 1, None, "test"))
    assert rig.compaction.subtasks_at(2) == frozenset({0, 1})
    boom = OSError("delta commit conflict")
    rig.sinks[1].fail = boom
    rig.complete(manifest(2, 4, {0: ["a-t2"]}, sink_epochs={"main": 4, "audit": 4}))
    assert rig.state.failed and rig.state.error is boom
    assert rig.state.failure == "sink commit of checkpoint 2: delta commit conflict"
    assert rig.state.stop.is_set()
    assert uncommitted(rig.ends) == {4}, "its epochs' ends kept for the restore's redo"
    assert rig.catalog.shared == [], "no shared files registered"
    assert read_request(rig.storage, rig.layout) is not None, "the compaction request stays"
    assert rig.events.emitted == [] and rig.state.checkpoints == []


def test_a_failure_after_the_sink_commit_fails_the_attempt_naming_its_step(tmp_path):
    """The shared files could not be registered: the attempt fails with that cause (its last
    line, the catalog's failure_reason), and no event or latest pointer follows."""
    rig = Rig(tmp_path)
    boom = OSError("catalog unreachable")

    def refuse(rows):
        raise boom

    rig.catalog.record_shared_files = refuse
    rig.complete(manifest(2, 4, {0: ["a-t2"]}, sink_epochs={"main": 4, "audit": 4}))
    assert rig.state.failure == "registering its shared files of checkpoint 2: catalog unreachable"
    assert rig.state.error is boom and rig.state.stop.is_set()
    assert [c[0] for c in rig.sinks[0].commits] == [4], "the sinks committed before it"
    assert rig.completion.committed is None, "the latest committed pointer did not move"
    assert rig.events.emitted == [] and rig.state.checkpoints == []


def test_at_least_once_commits_nothing_and_forgets_nothing(tmp_path):
    rig = Rig(tmp_path, exactly_once=False)
    rig.ends.record(3, {"log": {"0": 30}})
    rig.complete(manifest(1, 3, {0: ["a-t1"]}, sink_epochs={"main": 3}))
    assert all(s.commits == [] for s in rig.sinks)
    assert uncommitted(rig.ends) == {3}
    assert rig.state.checkpoints == [1]
    assert "sink rows committed 0" in rig.lines[-1]


def test_only_new_shared_files_are_registered(tmp_path):
    restored = manifest(1, 1, {0: ["a-t1"], 1: ["b-t1"]})
    rig = Rig(tmp_path, restored=restored)
    rig.complete(manifest(2, 2, {0: ["a-t1", "c-t2"], 1: ["b-t1"]}))
    rig.complete(manifest(3, 3, {0: ["a-t1", "c-t2"], 1: ["b-t1"]}))  # nothing new
    rig.complete(manifest(4, 4, {0: ["c-t2"], 1: ["d-t4", "e-t4"]}))
    assert rig.catalog.shared == [
        [
            {
                "job_id": JOB,
                "path": "shared/count/0/c-t2.sst",
                "operator": "count",
                "subtask": 0,
                "size": 100,
                "created_by": 2,
                "last_used": 2,
                "refcount": 1,
                "status": "LIVE",
            }
        ],
        [
            {
                "job_id": JOB,
                "path": f"shared/count/1/{name}.sst",
                "operator": "count",
                "subtask": 1,
                "size": 100,
                "created_by": 4,
                "last_used": 4,
                "refcount": 1,
                "status": "LIVE",
            }
            for name in ("d-t4", "e-t4")
        ],
    ]
    assert rig.state.checkpoints == [2, 3, 4]


def test_without_a_restore_the_first_checkpoint_registers_every_shared_file(tmp_path):
    rig = Rig(tmp_path)
    rig.complete(manifest(1, 1, {0: ["a-t1"], 1: ["b-t1"]}))
    assert [r["path"] for r in rig.catalog.shared[0]] == [
        "shared/count/0/a-t1.sst",
        "shared/count/1/b-t1.sst",
    ]


def test_a_served_compaction_request_is_cleared_by_its_checkpoint(tmp_path):
    restored = manifest(1, 1, {0: ["a-t1", "b-t1"], 1: ["c-t1"]})  # 5 files
    rig = Rig(tmp_path, restored=restored)
    write_request(rig.storage, rig.layout, CompactionRequest((1,), 1, 1, "too many files"))
    assert rig.compaction.subtasks_at(2) == frozenset({1})
    rig.compaction.compacted(2, 12.0)
    rig.complete(manifest(2, 2, {0: ["z-t2"]}))  # 2 files
    assert read_request(rig.storage, rig.layout) is None
    compacted = [p for k, p in rig.events.emitted if k == "compacted"]
    assert compacted == [
        {
            "checkpoint_id": 2,
            "subtasks": [1],
            "files_before": 5,
            "files_after": 2,
            "compact_ms": 12.0,
        }
    ]
    assert rig.events.kinds() == ["compacted", "checkpoint"]
    with rig.state.compaction() as slot:
        assert slot.serving is None


def test_an_aborted_checkpoint_releases_the_request_for_the_next_barrier(tmp_path):
    rig = Rig(tmp_path)
    write_request(rig.storage, rig.layout, CompactionRequest((), 1, None, "test"))
    assert rig.compaction.subtasks_at(2)
    assert rig.compaction.subtasks_at(3) == frozenset(), "served by checkpoint 2 already"
    rig.completion.on_checkpoint_aborted(2, "expired")
    assert rig.lines[-1] == "checkpoint 2 aborted: expired"
    assert rig.state.summary(JOB, 1, {}).aborted == [2]
    assert rig.state.wait_for_checkpoint(2, 0) is False
    assert read_request(rig.storage, rig.layout) is not None
    assert rig.compaction.subtasks_at(4) == frozenset({0, 1}), "served again"
    rig.complete(manifest(4, 4, {0: ["a-t4"]}))
    assert read_request(rig.storage, rig.layout) is None
    assert rig.state.checkpoints == [4]


def test_a_checkpoint_before_the_serving_one_leaves_the_request(tmp_path):
    rig = Rig(tmp_path)
    write_request(rig.storage, rig.layout, CompactionRequest((), 1, None, "test"))
    rig.compaction.subtasks_at(5)
    rig.complete(manifest(4, 4, {0: ["a-t4"]}))
    assert read_request(rig.storage, rig.layout) is not None
    assert "compacted" not in rig.events.kinds()


def test_a_checkpointing_failure_fails_the_attempt(tmp_path):
    rig = Rig(tmp_path)
    error = RuntimeError("too many declined checkpoints")
    rig.completion.on_job_failed(error)
    assert rig.state.failure == "checkpointing failed: too many declined checkpoints"
    assert rig.state.error is error and rig.state.stop.is_set()


# -- savepoints ----------------------------------------------------------------------------


def test_a_savepoint_is_written_once_its_checkpoints_output_is_committed(tmp_path):
    rig = Rig(tmp_path)
    ask_savepoint(rig.storage, rig.layout, SavepointRequest("r1", str(tmp_path / "sp"), False, 1))
    rig.savepoints.at_barrier(2)
    rig.complete(rig.stored(manifest(2, 4, {0: ["a-t2"]}, sink_epochs={"main": 4})))
    assert rig.sinks[0].commits and rig.state.checkpoints == [2] and not rig.state.stop.is_set()
    [row] = rig.catalog.recorded
    assert row["status"] == "COMPLETED" and row["location"].endswith("/sp/savepoint-2-r1")
    assert (row["checkpoint_id"], row["batch_id"], row["code_version"]) == (2, 4, "v7")
    saved = read_savepoint(open_storage(row["location"]), checksums=False)
    assert saved.savepoint and saved.checkpoint_id == 2
    assert pending_savepoint(rig.storage, rig.layout) is None, "the request is cleared"
    assert rig.events.kinds() == ["savepoint", "checkpoint"]
    rig.complete(rig.stored(manifest(3, 5, {0: ["b-t3"]})))
    assert len(rig.catalog.recorded) == 1, "served once"


def test_a_stop_request_stops_the_run_and_its_final_checkpoint_is_the_savepoint(tmp_path):
    rig = Rig(tmp_path)
    ask_savepoint(rig.storage, rig.layout, SavepointRequest("r2", "", True, 1))
    rig.savepoints.at_barrier(2)
    assert rig.state.stop.is_set(), "no micro-batch after this one"
    rig.complete(rig.stored(manifest(2, 4, {0: ["a-t2"]})))
    assert rig.catalog.recorded == [], "the barrier's checkpoint is not the last one"
    rig.savepoints.at_final(3)
    rig.complete(rig.stored(manifest(3, 5, {0: ["a-t2"]})))
    [row] = rig.catalog.recorded
    assert row["stopped"] and row["checkpoint_id"] == 3
    assert row["location"] == (tmp_path / "savepoints" / JOB / "savepoint-3-r2").as_uri()


def test_a_savepoint_that_cannot_be_written_is_recorded_failed_and_the_job_goes_on(tmp_path):
    rig = Rig(tmp_path)
    (tmp_path / "a-file").write_text("not a directory")
    ask_savepoint(
        rig.storage, rig.layout, SavepointRequest("r3", str(tmp_path / "a-file"), False, 1)
    )
    rig.savepoints.at_barrier(2)
    rig.complete(rig.stored(manifest(2, 4, {0: ["a-t2"]})))
    [row] = rig.catalog.recorded
    assert row["status"] == "FAILED" and "a-file" in row["reason"]
    assert not rig.state.failed and rig.state.checkpoints == [2]
    assert pending_savepoint(rig.storage, rig.layout) is None


def test_an_aborted_checkpoint_leaves_the_savepoint_to_the_next_barrier(tmp_path):
    rig = Rig(tmp_path)
    ask_savepoint(rig.storage, rig.layout, SavepointRequest("r4", str(tmp_path / "sp"), False, 1))
    rig.savepoints.at_barrier(2)
    rig.savepoints.at_barrier(3)  # served by 2 already
    rig.completion.on_checkpoint_aborted(2, "expired")
    rig.complete(rig.stored(manifest(3, 4, {0: ["a-t3"]})))
    assert rig.catalog.recorded == [], "3 was triggered while 2 served it"
    rig.savepoints.at_barrier(4)
    rig.complete(rig.stored(manifest(4, 5, {0: ["a-t4"]})))
    assert [r["checkpoint_id"] for r in rig.catalog.recorded] == [4]


# -- an attempt that died serving a request ------------------------------------------------


def test_a_request_whose_savepoint_was_recorded_is_served_once(tmp_path):
    """Killed after the row was recorded, before the request was cleared: the next attempt
    clears it and writes no second savepoint (a stop request does not stop it again)."""
    rig = Rig(tmp_path)
    ask_savepoint(rig.storage, rig.layout, SavepointRequest("r5", str(tmp_path / "sp"), True, 1))
    rig.catalog.record_savepoint({"job_id": JOB, "request_id": "r5", "status": "COMPLETED"})
    assert not rig.savepoints.when_idle(None, pending=False), "no stop either"
    rig.savepoints.at_barrier(2)
    rig.complete(rig.stored(manifest(2, 4, {0: ["a-t2"]})))
    assert len(rig.catalog.recorded) == 1 and not rig.state.stop.is_set()
    assert pending_savepoint(rig.storage, rig.layout) is None
    assert any("r5 was served already" in line for line in rig.lines)


def test_a_savepoint_left_half_copied_is_deleted_and_written_again(tmp_path):
    rig = Rig(tmp_path)
    ask_savepoint(rig.storage, rig.layout, SavepointRequest("r6", str(tmp_path / "sp"), False, 1))
    half = tmp_path / "sp" / "savepoint-1-r6"
    (half / "shared").mkdir(parents=True)
    (half / "shared" / "x.sst").write_bytes(b"half")
    note_writing(rig.storage, rig.layout, "r6", half.as_uri())
    rig.savepoints.at_barrier(2)
    rig.complete(rig.stored(manifest(2, 4, {0: ["a-t2"]})))
    [row] = rig.catalog.recorded
    assert row["status"] == "COMPLETED" and row["checkpoint_id"] == 2
    assert not [f for f in half.rglob("*") if f.is_file()], "the half copy is gone"
    assert not rig.storage.exists(rig.layout.job_path(SAVEPOINT_WRITING))


def test_a_savepoint_written_but_not_recorded_is_recorded_not_written_twice(tmp_path):
    rig = Rig(tmp_path)
    whole = rig.left_whole(tmp_path, SavepointRequest("r7", str(tmp_path / "sp"), False, 1))
    rig.savepoints.at_barrier(2)
    rig.complete(rig.stored(manifest(2, 4, {0: ["a-t2"]})))
    [row] = rig.catalog.recorded
    assert (row["status"], row["checkpoint_id"], row["location"]) == ("COMPLETED", 1, whole.url)
    assert not (tmp_path / "sp" / "savepoint-2-r7").exists()
    assert pending_savepoint(rig.storage, rig.layout) is None


def test_a_damaged_savepoint_left_by_an_earlier_attempt_is_replaced(tmp_path):
    rig = Rig(tmp_path)
    whole = rig.left_whole(tmp_path, SavepointRequest("r8", str(tmp_path / "sp"), False, 1))
    damaged = next(f for f in whole.list() if f.path.endswith(".sst"))
    whole.put_bytes(damaged.path, b"y" * damaged.size)
    rig.savepoints.at_barrier(2)
    rig.complete(rig.stored(manifest(2, 4, {0: ["a-t2"]})))
    [row] = rig.catalog.recorded
    assert (row["status"], row["checkpoint_id"]) == ("COMPLETED", 2)
    assert not whole.exists("_metadata"), "the damaged one is deleted"


def test_a_stops_savepoint_left_by_an_earlier_attempt_gives_way_to_the_final_checkpoints(tmp_path):
    rig = Rig(tmp_path)
    whole = rig.left_whole(tmp_path, SavepointRequest("r9", str(tmp_path / "sp"), True, 1))
    rig.savepoints.at_barrier(2)
    rig.savepoints.at_final(3)
    rig.complete(rig.stored(manifest(3, 5, {0: ["a-t3"]})))
    [row] = rig.catalog.recorded
    assert (row["status"], row["checkpoint_id"], row["stopped"]) == ("COMPLETED", 3, True)
    assert not whole.exists("_metadata")


# -- a run with no new input --------------------------------------------------------------


def test_an_idle_run_serves_a_savepoint_from_its_latest_committed_checkpoint(tmp_path):
    rig = Rig(tmp_path)
    committed = rig.stored(manifest(5, 9, {0: ["a-t5"]}))
    assert not rig.savepoints.when_idle(committed, pending=False), "nothing asked"
    ask_savepoint(rig.storage, rig.layout, SavepointRequest("i1", str(tmp_path / "sp"), False, 1))
    assert not rig.savepoints.when_idle(committed, pending=True), "a pending one serves it later"
    assert rig.catalog.recorded == []
    assert not rig.savepoints.when_idle(committed, pending=False)
    [row] = rig.catalog.recorded
    assert (row["status"], row["checkpoint_id"], row["batch_id"]) == ("COMPLETED", 5, 9)
    assert pending_savepoint(rig.storage, rig.layout) is None
    with rig.state.savepoint() as slot:
        assert slot.serving is None
    rig.savepoints.at_barrier(6)  # the next barrier finds nothing to serve
    rig.complete(rig.stored(manifest(6, 10, {0: ["a-t6"]})))
    assert len(rig.catalog.recorded) == 1


def test_an_idle_run_asked_to_stop_stops_and_one_serving_a_barrier_is_left_alone(tmp_path):
    rig = Rig(tmp_path)
    committed = rig.stored(manifest(5, 9, {0: ["a-t5"]}))
    ask_savepoint(rig.storage, rig.layout, SavepointRequest("i2", "", True, 1))
    assert rig.savepoints.when_idle(committed, pending=False), "stop: the final checkpoint"
    assert rig.catalog.recorded == []
    ask_savepoint(rig.storage, rig.layout, SavepointRequest("i3", str(tmp_path / "sp"), False, 1))
    rig.savepoints.at_barrier(6)  # a barrier took the request first
    assert not rig.savepoints.when_idle(committed, pending=False)
    assert rig.catalog.recorded == []
    rig.complete(rig.stored(manifest(6, 10, {0: ["a-t6"]})))
    assert [r["checkpoint_id"] for r in rig.catalog.recorded] == [6]
