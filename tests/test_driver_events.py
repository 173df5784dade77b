"""A driver's events as Dagster events, without Spark: the metadata the UI shows for
checkpoints, restores and takeovers, and the run tags naming the active and standby drivers."""

from __future__ import annotations

import time
from types import SimpleNamespace

from dagster import FloatMetadataValue

from orchestration.driver_events import DriverEvents, checkpoint_metadata, started_metadata
from orchestration.partitions import DRIVER_PID_TAG, STANDBY_PID_TAG
from spark_jobs.executor.reports import SubtaskRestoreReport


def _plotted(metadata: dict) -> set[str]:
    """The keys the Dagster UI plots: numbers (ints, floats, float metadata values)."""
    return {k for k, v in metadata.items() if isinstance(v, int | float | FloatMetadataValue)}


def test_checkpoint_metadata_plots_measurements_in_mib_and_ms_and_not_identifiers():
    event = {
        "kind": "checkpoint", "checkpoint_id": 7, "batch_id": 20, "attempt": 2,
        "full_size": 3 * 2**20, "incremental_size": 2**19, "file_count": 12, "sync_ms": 3.5,
        "async_ms": 40.0, "trigger_time_ms": 1_000, "complete_time_ms": 1_450,
        "metadata_path": "clicks_per_user/chk-7/_metadata",
    }  # fmt: skip
    metadata = checkpoint_metadata(event)
    assert _plotted(metadata) == {
        "full_size_mib", "uploaded_mib", "file_count", "sync_ms", "async_ms", "duration_ms",
    }  # fmt: skip
    assert (metadata["full_size_mib"].value, metadata["uploaded_mib"].value) == (3.0, 0.5)
    assert metadata["duration_ms"] == 450.0
    ids = ("checkpoint_id", "batch_id", "attempt")
    assert [metadata[k].value for k in ids] == ["7", "20", "2"]


def test_a_restore_shows_its_checkpoint_each_subtasks_bytes_and_the_time_to_its_first_batch():
    reports = [  # as the driver's "started" event carries them: the executors' typed reports
        SubtaskRestoreReport("count", 0, "h1", "local", bytes_local=2**20, files_local=4,
                             duration_ms=250.0).to_dict(),
        SubtaskRestoreReport("count", 1, "h2", "remote", bytes_remote=2**21, files_remote=5,
                             duration_ms=1500.0).to_dict(),
    ]  # fmt: skip
    event = {"attempt": 3, "restored_from": 9, "allocation": {}, "restore_reports": reports}
    metadata = started_metadata(event, first_batch_ms=61_500, driver_started_ms=40_000)
    assert metadata["restored_from"].value == "chk-9" and metadata["attempt"].value == "3"
    assert metadata["time_to_first_batch_s"].value == 21.5
    assert (metadata["restored_local_mib"].value, metadata["restored_remote_mib"].value) == (1, 2)
    table = metadata["restore"].value.splitlines()
    assert table[2] == "| count | 0 | h1 | local | 1.000 | 0.000 | 0.25 |"
    assert table[3] == "| count | 1 | h2 | remote | 0.000 | 2.000 | 1.50 |"
    assert "attempt" not in _plotted(metadata)
    fresh = started_metadata({"attempt": 1, "restored_from": None}, 2_000, 1_000)
    assert fresh["restored_from"].value == "none" and fresh["restore"].value.count("\n") == 1
    assert "rescaled" not in metadata and "rescaled" not in fresh


def test_a_rescaled_restore_says_from_what_parallelism():
    """4 -> 2: each new subtask built from two old ones."""
    reports = [
        SubtaskRestoreReport("count", i, "h1", "remote", rescaled_from=(2 * i, 2 * i + 1)).to_dict()
        for i in range(2)
    ]
    event = {"attempt": 4, "restored_from": 9, "allocation": {}, "restore_reports": reports}
    metadata = started_metadata(event, first_batch_ms=2_000, driver_started_ms=1_000)
    assert metadata["rescaled"] == "from parallelism 4 to 2"


class _Context:
    """The few parts of an op's context the events touch: run tags, logs, logged events."""

    def __init__(self) -> None:
        self.run_id = "r1"
        self.tags: dict[str, str] = {}
        self.events: list = []
        self.lines: list[str] = []
        self.instance = SimpleNamespace(add_run_tags=lambda _run, tags: self.tags.update(tags))
        self.log = SimpleNamespace(info=self.lines.append, warning=self.lines.append)

    def log_event(self, event) -> None:
        self.events.append(event)


def _ms() -> int:
    return int(time.time() * 1000)


def _started(attempt: int) -> dict:
    return {"kind": "started", "attempt": attempt, "restored_from": 4, "allocation": {}}


def test_a_takeover_is_its_attempts_start_with_the_seconds_from_detection_to_first_batch():
    context = _Context()
    events = DriverEvents(context, "clicks_per_user")
    takeover_ms = _ms() - 10_000
    messages = [
        {"kind": "driver", "pid": 11, "standby": False},
        {"kind": "drivers", "active": 11, "standby": None},
        _started(1),
        {"kind": "batch", "epoch": 0},
        {"kind": "driver", "pid": 12, "standby": True},  # the standby, warming up
        {"kind": "drivers", "active": 11, "standby": 12},
    ]
    events(messages)
    assert context.tags == {DRIVER_PID_TAG: "11", STANDBY_PID_TAG: "12"}
    assert [e.asset_key.path for e in context.events] == [["streaming_jobs"]]
    assert "takeover_s" not in context.events[0].metadata

    messages += [
        {"kind": "batch", "epoch": 1},  # the old attempt's: no new start
        {"kind": "takeover", "from": 11, "to": 12, "exit": -9, "at_ms": takeover_ms},
        {"kind": "drivers", "active": 12, "standby": None},
        {"kind": "batch", "epoch": 2},  # a late line of the old driver: not the new start
        _started(2),
        {"kind": "batch", "epoch": 2, "at_ms": takeover_ms + 3_250},
    ]
    events(messages)
    assert context.tags == {DRIVER_PID_TAG: "12", STANDBY_PID_TAG: "none"}
    started = [e for e in context.events if e.asset_key.path == ["streaming_jobs"]]
    assert len(started) == 2
    metadata = started[1].metadata
    assert metadata["attempt"].value == "2" and metadata["replaced_driver"].value == "11"
    assert metadata["replaced_exit"].value == "-9" and metadata["takeover"].value == "1"
    assert isinstance(metadata["takeover_s"], FloatMetadataValue)
    assert metadata["takeover_s"].value == 3.25  # by the driver's clock, not the op's
    assert any("12 takes over" in line for line in context.lines)
    events(messages)  # nothing twice
    assert len(context.events) == 2
