"""The streaming Dagster job without Spark: one active run per streaming job, and the
metadata the UI shows for checkpoints and restores."""

from __future__ import annotations

from dagster import DagsterRunStatus, FloatMetadataValue, instance_for_test

from orchestration.definitions import defs
from orchestration.partitions import JOB_TAG
from orchestration.resources import CutlinePaths
from orchestration.streaming import checkpoint_metadata, started_metadata, streaming_job
from spark_jobs.executor.reports import SubtaskRestoreReport

JOB = "clicks_per_user"


def test_a_second_active_run_of_the_same_streaming_job_is_refused(tmp_path):
    with instance_for_test() as instance:
        instance.add_dynamic_partitions("streaming_jobs", [JOB])
        running = instance.create_run_for_job(
            job_def=streaming_job, tags={JOB_TAG: JOB}, status=DagsterRunStatus.STARTED
        )
        result = defs.get_job_def("streaming_job").execute_in_process(
            partition_key=JOB,
            instance=instance,
            resources={"cutline_paths": CutlinePaths(home=str(tmp_path))},
            raise_on_error=False,
        )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert f"already has an active run: {running.run_id}" in str(failure.step_failure_data.error)
    assert not (tmp_path / "warehouse").exists()  # no driver was submitted


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
