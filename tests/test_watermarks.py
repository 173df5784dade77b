"""Per-partition watermarks on the driver (spark_jobs/driver/progress.py ``Progress.fold``), no
Spark: the minimum over the input partitions of their largest event time less the bound; a
lagging partition holds it, an idle one stops holding it after ``idle_timeout_ms`` and rejoins
with records; never backwards; a restore from a manifest folds on to the same watermarks; the
manifest and the sink's commit infos carry the clocks and the epochs' processing times."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cutline import DeltaSink, JobDefinition, JobDefinitionError, LogSource
from cutline.keyed_process import partition_event_times
from cutline.operators import WindowedAggregate
from cutline.sinks.delta import DeltaSinkWriter
from spark_jobs.driver.progress import Progress
from spark_jobs.driver.restore_fallback import replay_epochs
from spark_jobs.executor.reports import SubtaskStats
from state.config import CheckpointConfig
from state.manifest import CheckpointManifest, PartitionClock
from tests.test_delta_sink import roots

BOUND, IDLE = 2_000, 5_000
SCHEMA = "user string, amount double, ts long"


def job(idle: int | None = IDLE) -> JobDefinition:
    stage = WindowedAggregate(
        "w", "orders", "user", "string", "ts", 10_000, BOUND, {"n": ("count", None)},
        idle_timeout_ms=idle,
    )  # fmt: skip
    return JobDefinition(
        name="wm", sources=(LogSource("orders", "orders", SCHEMA),), operator=stage,
        sink=DeltaSink("out", "out"), checkpoint=CheckpointConfig(interval_ms=1_000),
    )  # fmt: skip


def stats(times: dict[str, int], subtask: int = 0) -> SubtaskStats:
    """A subtask of stage ``w`` that applied records of the given partitions, with those
    largest event times."""
    return SubtaskStats(
        stage="w", subtask=subtask, host="h", records=len(times), output_rows=0, positions={},
        sync_ms=0.0, compact_ms=0.0, late_records=0,
        max_event_time=max(times.values()) if times else None, bad_records=0, first_bad=None,
        event_times={"orders": times} if times else {},
    )  # fmt: skip


def fold_all(progress: Progress, batches: list[tuple[int, dict[str, int]]]) -> list[int | None]:
    """Fold (processing time, per-partition event times) batches; the watermark after each."""
    out = []
    for now, times in batches:
        progress.fold([stats(times)], now)
        out.append(progress.watermarks.get("w"))
    return out


def test_a_lagging_partition_holds_the_watermark():
    p = Progress(job())
    got = fold_all(p, [(1_000, {"0": 50_000, "1": 10_000}), (2_000, {"0": 60_000, "1": 11_000})])
    assert got == [10_000 - BOUND, 11_000 - BOUND]  # the old rule: 48_000, then 58_000


def test_a_partition_never_seen_does_not_hold_it_back():
    p = Progress(job())
    assert fold_all(p, [(1_000, {"0": 50_000})]) == [48_000]


def test_an_idle_partition_stops_holding_it_and_rejoins():
    p = Progress(job())
    got = fold_all(
        p,
        [
            (0, {"0": 10_000, "1": 10_000}),
            (2_000, {"0": 20_000}),  # partition 1 quiet for 2 s: still holds
            (4_999, {"0": 30_000}),  # 4.999 s: still holds
            (5_000, {"0": 40_000}),  # 5 s without records: idle, left out
            (6_000, {"1": 12_000}),  # rejoins: holds again, but never backwards
            (7_000, {"0": 50_000, "1": 45_000}),  # the minimum moves on
        ],
    )
    assert got == [8_000, 8_000, 8_000, 38_000, 38_000, 43_000]


def test_every_partition_idle_holds_and_none_idle_without_a_timeout():
    p = Progress(job())
    assert fold_all(p, [(0, {"0": 10_000}), (60_000, {})]) == [8_000, 8_000]
    never = Progress(job(idle=None))
    got = fold_all(never, [(0, {"0": 9_000, "1": 10_000}), (10**9, {"0": 99_000})])
    assert got == [7_000, 8_000], "without a timeout partition 1 holds forever"


def test_it_never_goes_backwards():
    p = Progress(job())
    got = fold_all(p, [(0, {"0": 30_000}), (1, {"1": 5_000}), (2, {"0": 40_000, "1": 6_000})])
    assert got == [28_000, 28_000, 28_000]


def test_partitions_of_several_subtasks_combine():
    p = Progress(job())
    p.fold([stats({"0": 20_000}, 0), stats({"1": 15_000}, 1)], 0)
    assert p.watermarks["w"] == 13_000


def manifest_of(p: Progress, batch: int, **extra) -> CheckpointManifest:
    return CheckpointManifest(
        job_id="wm", checkpoint_id=batch, batch_id=batch, attempt=1, trigger_time_ms=0,
        source_positions={}, subtasks=(), watermarks=dict(p.watermarks),
        partition_clocks=p.clocks_copy(), counters=dict(p.counters), **extra,
    )  # fmt: skip


BATCHES = [
    (0, {"0": 10_000, "1": 10_000}),
    (1_000, {"0": 20_000}),
    (3_000, {"0": 25_000}),
    (6_000, {"0": 30_000}),  # partition 1 idle
    (7_000, {"1": 31_000}),
    (8_000, {"0": 32_000, "1": 40_000}),
    (20_000, {}),
    (21_000, {"1": 50_000}),
]


@pytest.mark.parametrize("cut", range(len(BATCHES)))
def test_a_restore_from_a_manifest_folds_on_as_if_uninterrupted(cut):
    whole = Progress(job())
    expected = fold_all(whole, BATCHES)
    before = Progress(job())
    fold_all(before, BATCHES[: cut + 1])
    manifest = CheckpointManifest.from_json(manifest_of(before, cut).to_json())
    after = Progress(job())
    after.adopt(manifest)
    assert fold_all(after, BATCHES[cut + 1 :]) == expected[cut + 1 :]
    assert after.clocks == whole.clocks


def test_manifest_round_trip_and_old_manifests():
    p = Progress(job())
    fold_all(p, BATCHES[:3])
    m = manifest_of(p, 3, epoch_times={4: 123, 5: 456})
    back = CheckpointManifest.from_json(m.to_json())
    assert back == m
    assert back.partition_clocks["w"]["orders"]["1"] == PartitionClock(10_000, 0)
    doc = m.to_json().replace(b'"epoch_times"', b'"x1"').replace(b'"partition_clocks"', b'"x2"')
    old = CheckpointManifest.from_json(doc)
    assert old.epoch_times == {} and old.partition_clocks == {}
    restored = Progress(job())
    restored.adopt(old)
    assert restored.watermarks == p.watermarks, "the restored watermark stays the floor"
    assert fold_all(restored, [(5_000, {"0": 1_000})]) == [p.watermarks["w"]]
    bad = m.to_json().replace(b"123", b'"soon"')
    with pytest.raises(ValueError, match="malformed"):
        CheckpointManifest.from_json(bad)


def test_replay_epochs_take_their_recorded_processing_times():
    m = CheckpointManifest(
        job_id="wm", checkpoint_id=1, batch_id=1, attempt=1, trigger_time_ms=900,
        source_positions={"orders": {"0": 0}}, subtasks=(),
    )  # fmt: skip
    ends = {e: {"orders": {"0": e}} for e in range(2, 6)}
    epochs = replay_epochs(m, 5, ends, {3: 3_000, 5: 5_000})
    assert [e.processing_time for e in epochs] == [900, 3_000, 3_000, 5_000]


def test_the_sink_records_each_epochs_processing_time(tmp_path):
    sink = DeltaSinkWriter("job", "out", "out", *roots(tmp_path), attempt=1)
    sink.fence()
    ends = {e: {"orders": {"0": e}} for e in range(4)}
    sink.commit_through(1, {0: ends[0], 1: ends[1]})  # an older Cutline: no times
    sink.commit_through(3, ends, times={2: 2_000, 3: 3_000})
    assert sink.committed_ends(-1) == ends
    assert sink.committed_times(-1) == {2: 2_000, 3: 3_000}
    assert sink.committed_times(2) == {3: 3_000}


def test_partition_event_times_and_the_timeout_is_validated():
    table = pa.table(
        {"_source": ["a", "a", "b", "a"], "_partition": pa.array([0, 1, 0, 0], pa.int32()),
         "ts": [5, 7, None, 9]}
    )  # fmt: skip
    assert partition_event_times(table, "ts") == {"a": {"0": 9, "1": 7}}
    assert partition_event_times(table.drop(["_source"]), "ts") == {}
    for wrong in (0, -1, 1.5, True):
        with pytest.raises(JobDefinitionError, match="idle_timeout_ms"):
            job(idle=wrong)
