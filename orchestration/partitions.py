"""One dynamic partition per registered streaming job, and the run tags Cutline uses."""

from __future__ import annotations

from dagster import DynamicPartitionsDefinition

streaming_job_partitions = DynamicPartitionsDefinition(name="streaming_jobs")

JOB_TAG = "cutline/job"  # the streaming job a run runs; one active run per value (dagster.yaml)
RESTORE_OF_TAG = "cutline/restore-of"  # the failed run a restore run replaces
ATTEMPT_TAG = "cutline/restore-number"  # how many restores in the current window, this one included
RESTART_TAG = "cutline/restart"  # on a failed run: what the restore strategy decided
WORKER_PID_TAG = "cutline/worker-pid"  # the Dagster run worker that launched the driver
SUBMIT_PID_TAG = "cutline/submit-pid"  # the spark-submit process (or standby supervisor)
DRIVER_PID_TAG = "cutline/driver-pid"  # the (active) driver itself (kill -9 it to see a restore)
STANDBY_PID_TAG = "cutline/standby-pid"  # its warm standby driver ("none" while there is none)
EXIT_CODE_TAG = "cutline/exit-code"  # how the driver exited (orchestration.restart)
SAVEPOINT_TAG = "cutline/savepoint"  # on an upgrade run: the savepoint it stopped the job with
UPGRADE_OF_TAG = "cutline/upgrade-of"  # the upgrade run whose savepoint a streaming run restores
