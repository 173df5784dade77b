"""The checkpoint coordinator protocol, driven with injected time (no sleeping)."""

from __future__ import annotations

import threading

import pytest

from state.catalog import CheckpointStatus, FencedError
from state.config import CheckpointConfig, ConfigError
from state.coordinator import AckResult, CheckpointCoordinator, CheckpointFailureError
from state.handles import StateFile, SubtaskStateHandle
from state.keygroups import KeyGroupRange
from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.storage import LocalFileStorage
from tests.fakes import FaultyStorage, InMemoryCatalog

JOB = "job1"
TASKS = [("count", 0), ("count", 1), ("sink", 0)]


class Recorder:
    def __init__(self):
        self.events = []

    def on_checkpoint_complete(self, checkpoint, manifest):
        self.events.append(("complete", checkpoint.checkpoint_id))

    def on_checkpoint_aborted(self, checkpoint_id, reason):
        self.events.append(("abort", checkpoint_id, reason))

    def on_job_failed(self, error):
        self.events.append(("failed", type(error).__name__))


def handle(task, cid, name="000010.sst"):
    op, sub = task
    return SubtaskStateHandle(
        operator=op,
        subtask=sub,
        key_group_range=KeyGroupRange(sub * 64, sub * 64 + 63),
        checkpoint_id=cid,
        files=(StateFile(name, f"shared/{op}/{sub}/{name}", 10, "crc32:00000000"),),
        uploaded_bytes=10,
    )


def make(tmp_path, catalog=None, storage=None, **cfg):
    catalog = catalog or InMemoryCatalog()
    attempt = catalog.begin_attempt(JOB)
    rec = Recorder()
    config = CheckpointConfig(**{"interval_ms": 1000, **cfg})
    coord = CheckpointCoordinator(
        JOB,
        attempt,
        config,
        TASKS,
        storage or LocalFileStorage(tmp_path / "remote"),
        catalog,
        listeners=[rec],
    )
    return coord, catalog, rec


def ack_all(coord, cid, now, tasks=TASKS):
    results = []
    for t in tasks:
        h = handle(t, cid) if t[0] != "sink" else None
        results.append(coord.acknowledge(cid, t, h, now))
    return results


def test_trigger_policy_interval_min_pause_and_max_concurrent(tmp_path):
    coord, _, _ = make(tmp_path, interval_ms=1000, min_pause_ms=500, max_concurrent=2)
    assert coord.trigger(1, {}, now_ms=0).checkpoint_id == 1
    assert coord.trigger(2, {}, now_ms=999) is None, "interval not yet elapsed"
    assert coord.trigger(3, {}, now_ms=1000).checkpoint_id == 2
    assert coord.trigger(4, {}, now_ms=5000) is None, "max_concurrent=2 reached"
    ack_all(coord, 1, now=5100)
    assert coord.trigger(5, {}, now_ms=5200) is None, "min pause after completion"
    assert coord.trigger(6, {}, now_ms=5600).checkpoint_id == 3


def test_completion_writes_manifest_then_commits_and_notifies(tmp_path):
    coord, catalog, rec = make(tmp_path)
    p = coord.trigger(7, {"clicks": {"0": 42, "1": 17}}, now_ms=0, sink_epochs={"out": 7})
    results = ack_all(coord, p.checkpoint_id, now=250)
    assert results == [AckResult.ACCEPTED, AckResult.ACCEPTED, AckResult.COMPLETED]
    [row] = catalog.checkpoints(JOB)
    assert (row.checkpoint_id, row.batch_id, row.status) == (1, 7, CheckpointStatus.COMPLETED)
    assert row.complete_time_ms == 250 and row.file_count == 2 and row.full_size == 20
    storage = LocalFileStorage(tmp_path / "remote")
    manifest = CheckpointManifest.from_json(storage.get_bytes(row.metadata_path))
    assert manifest.source_positions == {"clicks": {"0": 42, "1": 17}}
    assert manifest.sink_epochs == {"out": 7}
    assert [h.task for h in manifest.subtasks] == [("count", 0), ("count", 1)]
    assert rec.events == [("complete", 1)]
    assert coord.latest_completed.checkpoint_id == 1
    assert coord.base_handle(("count", 1)) == handle(("count", 1), 1)


def test_duplicate_late_and_unknown_acks(tmp_path):
    coord, _, _ = make(tmp_path, tolerable_failed_checkpoints=1)
    coord.trigger(1, {}, now_ms=0)
    t = ("count", 0)
    assert coord.acknowledge(1, t, handle(t, 1), 1) is AckResult.ACCEPTED
    assert coord.acknowledge(1, t, handle(t, 1), 1) is AckResult.DUPLICATE
    assert coord.acknowledge(99, t, handle(t, 99), 1) is AckResult.UNKNOWN
    assert coord.acknowledge(1, ("other", 0), None, 1) is AckResult.UNKNOWN
    coord.decline(1, ("count", 1), "disk full")
    assert coord.acknowledge(1, ("sink", 0), None, 2) is AckResult.LATE
    coord.trigger(2, {}, now_ms=5000)
    with pytest.raises(ValueError, match="acked as"):
        coord.acknowledge(2, t, handle(("count", 1), 2), 5001)


def test_timeouts_and_tolerable_failures_fail_the_job(tmp_path):
    coord, _, rec = make(tmp_path, timeout_ms=100, tolerable_failed_checkpoints=1)
    coord.trigger(1, {}, now_ms=0)
    assert coord.expire(now_ms=99) == []
    assert coord.expire(now_ms=100) == [1]
    assert coord.failure is None, "one failure is tolerated"
    coord.trigger(2, {}, now_ms=1000)
    ack_all(coord, 2, now=1010)  # a completion resets the count
    coord.trigger(3, {}, now_ms=2000)
    coord.decline(3, ("count", 0), "boom")
    assert coord.failure is None
    coord.trigger(4, {}, now_ms=3000)
    coord.expire(now_ms=3100)
    assert isinstance(coord.failure, CheckpointFailureError)
    assert "tolerable_failed_checkpoints=1" in str(coord.failure)
    assert rec.events[-1] == ("failed", "CheckpointFailureError")
    assert coord.trigger(5, {}, now_ms=10_000) is None, "a failed job triggers nothing"


def test_completing_a_newer_checkpoint_aborts_older_pending_ones(tmp_path):
    coord, _, rec = make(tmp_path, max_concurrent=3)
    coord.trigger(1, {}, now_ms=0)
    coord.trigger(2, {}, now_ms=1000)
    ack_all(coord, 2, now=1500)
    assert coord.pending_ids() == []
    assert ("complete", 2) in rec.events
    assert any(e[0] == "abort" and e[1] == 1 for e in rec.events)
    assert coord.acknowledge(1, ("count", 0), handle(("count", 0), 1), 1600) is AckResult.LATE
    assert coord.failure is None, "subsumed pending checkpoints are not failures"


def test_subsumption_keeps_num_retained_and_savepoints(tmp_path):
    coord, catalog, _ = make(tmp_path, num_retained=2)
    for n in range(1, 6):
        coord.trigger(n, {}, now_ms=n * 1000, force=False, savepoint=(n == 2))
        ack_all(coord, n, now=n * 1000 + 10)
    statuses = {r.checkpoint_id: r.status for r in catalog.checkpoints(JOB)}
    assert statuses == {
        1: CheckpointStatus.SUBSUMED,
        2: CheckpointStatus.COMPLETED,  # savepoint
        3: CheckpointStatus.SUBSUMED,
        4: CheckpointStatus.COMPLETED,
        5: CheckpointStatus.COMPLETED,
    }
    assert [c.checkpoint_id for c in coord.retained()] == [2, 4, 5]


def test_a_fenced_attempt_cannot_complete_a_checkpoint(tmp_path):
    coord, catalog, rec = make(tmp_path)
    coord.trigger(1, {}, now_ms=0)
    catalog.begin_attempt(JOB)  # a newer attempt starts (e.g. a restore run)
    ack_all(coord, 1, now=10)
    assert catalog.checkpoints(JOB) == []
    assert isinstance(coord.failure, FencedError)
    assert ("failed", "FencedError") in rec.events


def test_failed_manifest_write_aborts_and_counts(tmp_path):
    storage = FaultyStorage(LocalFileStorage(tmp_path / "remote"))
    storage.fail_put = lambda path: path.endswith("_metadata")
    coord, catalog, rec = make(tmp_path, storage=storage, tolerable_failed_checkpoints=5)
    coord.trigger(1, {}, now_ms=0)
    ack_all(coord, 1, now=10)
    assert catalog.checkpoints(JOB) == []
    assert rec.events[0][:2] == ("abort", 1) and "completion failed" in rec.events[0][2]
    storage.fail_put = lambda path: False
    coord.trigger(2, {}, now_ms=1000)
    ack_all(coord, 2, now=1010)
    assert [r.checkpoint_id for r in catalog.checkpoints(JOB)] == [2]


def test_restarted_coordinator_continues_ids_and_bases_on_the_restored_checkpoint(tmp_path):
    coord, catalog, _ = make(tmp_path)
    coord.trigger(1, {}, now_ms=0)
    ack_all(coord, 1, now=10)
    restored = coord.latest_completed
    attempt = catalog.begin_attempt(JOB)
    coord2 = CheckpointCoordinator(
        JOB,
        attempt,
        CheckpointConfig(interval_ms=1000),
        TASKS,
        LocalFileStorage(tmp_path / "remote"),
        catalog,
        restored=restored,
    )
    assert coord2.base_handle(("count", 0)) == handle(("count", 0), 1)
    assert coord2.trigger(2, {}, now_ms=0).checkpoint_id == 2


def test_concurrent_acks_from_many_threads_complete_each_checkpoint_once(tmp_path):
    tasks = [("op", i) for i in range(16)]
    catalog = InMemoryCatalog()
    rec = Recorder()
    coord = CheckpointCoordinator(
        JOB,
        catalog.begin_attempt(JOB),
        CheckpointConfig(interval_ms=1, max_concurrent=10, num_retained=100),
        tasks,
        LocalFileStorage(tmp_path / "remote"),
        catalog,
        listeners=[rec],
    )
    for n in range(1, 11):
        coord.trigger(n, {}, now_ms=n)
    results = []

    def worker(task):
        for n in range(1, 11):
            results.append(coord.acknowledge(n, task, handle(task, n), 100))

    threads = [threading.Thread(target=worker, args=(t,)) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    completed = [e for e in rec.events if e[0] == "complete"]
    rows = catalog.checkpoints(JOB)
    assert results.count(AckResult.COMPLETED) == len(completed) == len(rows)
    assert coord.pending_ids() == []
    assert max(r.checkpoint_id for r in rows) == 10, "the newest checkpoint always completes"


def test_bad_configuration_names_the_field():
    with pytest.raises(ConfigError, match=r"checkpoint\.interval_ms"):
        CheckpointConfig(interval_ms=0)
    with pytest.raises(ConfigError, match=r"checkpoint\.max_concurrent"):
        CheckpointConfig(interval_ms=10, max_concurrent=0)
    with pytest.raises(ConfigError, match=r"checkpoint\.mode"):
        CheckpointConfig(interval_ms=10, mode="twice")
    with pytest.raises(ConfigError, match=r"checkpoint\.snapshot_compression must be one of"):
        CheckpointConfig(interval_ms=10, snapshot_compression="gzip")
    with pytest.raises(ConfigError, match=r"checkpoint\.incremental must be bool"):
        CheckpointConfig(interval_ms=10, incremental="yes")
    with pytest.raises(ConfigError, match="unknown checkpoint option"):
        CheckpointConfig.from_dict({"interval_ms": 10, "intervall": 3})
    cfg = CheckpointConfig(interval_ms=10)
    assert (cfg.num_retained, cfg.timeout_ms, cfg.max_concurrent) == (1, 600_000, 1)
    assert CheckpointConfig.from_dict(cfg.to_dict()) == cfg


def test_manifest_path_layout():
    assert JobLayout(JOB).metadata(3) == "chk-3/_metadata"


def test_checkpoint_ids_never_collide_with_a_zombie_or_an_orphan_manifest(tmp_path):
    """Ids are claimed at the trigger: a successor skips the ids a zombie (still running) claimed
    and the id of an orphan manifest (written by a driver killed before its catalog commit), so
    its checkpoints complete, the zombie's are fenced, and no manifest is ever replaced."""
    catalog = InMemoryCatalog()
    storage = LocalFileStorage(tmp_path / "remote")
    config = CheckpointConfig(interval_ms=1, max_concurrent=3)
    zombie = CheckpointCoordinator(JOB, catalog.begin_attempt(JOB), config, TASKS, storage, catalog)
    assert zombie.trigger(1, {"src": {"0": 1}}, now_ms=0).checkpoint_id == 1
    rec = Recorder()
    successor = CheckpointCoordinator(
        JOB, catalog.begin_attempt(JOB), config, TASKS, storage, catalog, listeners=[rec]
    )
    assert successor.trigger(7, {"src": {"0": 7}}, now_ms=0).checkpoint_id == 2
    assert zombie.trigger(2, {}, now_ms=10).checkpoint_id == 3  # 2 is the successor's
    ack_all(zombie, 1, now=5)  # writes chk-1/_metadata, then its commit is fenced
    ack_all(successor, 2, now=6)
    assert [(r.checkpoint_id, r.attempt) for r in catalog.checkpoints(JOB)] == [(2, 2)]
    assert isinstance(zombie.failure, FencedError)
    orphan = CheckpointManifest.from_json(storage.get_bytes("job1/chk-1/_metadata"))
    assert orphan.attempt == zombie.attempt  # left alone; GC collects it
    # a third attempt (the successor died after chk-3 was claimed by the zombie and chk-4's
    # manifest was written but never committed) starts from the catalog: 3 and 4 are skipped
    storage.put_bytes("job1/chk-4/_claim", b"{}", exclusive=True)
    storage.put_bytes("job1/chk-4/_metadata", b"{}", exclusive=True)
    third = CheckpointCoordinator(
        JOB, catalog.begin_attempt(JOB), config, TASKS, storage, catalog, listeners=[rec]
    )
    assert third.trigger(9, {}, now_ms=100).checkpoint_id == 5
    ack_all(third, 5, now=101)
    assert [r.checkpoint_id for r in catalog.checkpoints(JOB)] == [2, 5]
    assert third.stats["ids_skipped"] == 2 and third.failure is None
    assert not any(e[0] == "abort" for e in rec.events)


def test_acks_of_another_attempt_are_never_applied(tmp_path):
    from state.acks import Ack

    coord, catalog, _ = make(tmp_path)
    p = coord.trigger(1, {}, now_ms=0)
    stale = Ack(coord.attempt - 1 or 99, p.checkpoint_id, "count", 0, handle(("count", 0), 1))
    assert coord.receive(stale, 1) is AckResult.UNKNOWN
    for task in TASKS:
        h = handle(task, p.checkpoint_id) if task[0] != "sink" else None
        ack = Ack(coord.attempt, p.checkpoint_id, *task, h, None if h else "no state")
        coord.receive(ack, 2)
    assert [r.checkpoint_id for r in catalog.checkpoints(JOB)] == []  # the sink declined
    assert coord.stats["aborted"] == 1


def test_a_checkpoint_waits_for_its_cut_to_be_recorded(tmp_path):
    """Positions known only after the micro-batch: acks alone cannot complete the checkpoint."""
    coord, catalog, _ = make(tmp_path)
    p = coord.trigger(3, None, now_ms=0)
    assert ack_all(coord, p.checkpoint_id, now=5)[-1] is AckResult.ACCEPTED
    assert catalog.checkpoints(JOB) == []
    assert coord.record_cut(p.checkpoint_id, {"src": {"0": 9}}, 6, sink_epochs={"out": 3}) is (
        AckResult.COMPLETED
    )
    [row] = catalog.checkpoints(JOB)
    assert row.source_positions == {"src": {"0": 9}}
    assert coord.record_cut(p.checkpoint_id, {}, 7) is AckResult.LATE
    q = coord.trigger(4, None, now_ms=2000)
    assert coord.record_cut(q.checkpoint_id, {"src": {"0": 10}}, 2001) is AckResult.ACCEPTED
    assert ack_all(coord, q.checkpoint_id, now=2002)[-1] is AckResult.COMPLETED


def test_a_listener_that_raises_fails_the_job_with_its_error_as_the_cause(tmp_path):
    """As Flink fails a job whose notifyCheckpointComplete throws: never only a log line."""
    coord, catalog, rec = make(tmp_path)

    class Broken(Recorder):
        def on_checkpoint_complete(self, checkpoint, manifest):
            raise OSError("catalog unreachable")

    broken = Broken()
    coord.listeners.insert(0, broken)
    coord.trigger(1, {}, now_ms=0)
    ack_all(coord, 1, now=10)
    assert [c.checkpoint_id for c in catalog.checkpoints(JOB)] == [1]  # it did complete
    assert rec.events == [("complete", 1), ("failed", "ListenerError")]
    assert broken.events == [("failed", "ListenerError")]
    assert str(coord.failure) == "checkpoint listener failed: OSError('catalog unreachable')"
    assert isinstance(coord.failure.__cause__, OSError)
