"""What a streaming run's driver says, as Dagster events: each completed checkpoint a
materialization of ``completed_checkpoints``, each attempt's first micro-batch (the job's start,
a restore's or a standby's takeover) one of ``streaming_jobs``, and which driver process is the
active one (and which the standby) as run tags.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from dagster import AssetMaterialization, MetadataValue, OpExecutionContext

from orchestration.metadata import MIB, ident, md_table, mib
from orchestration.partitions import DRIVER_PID_TAG, STANDBY_PID_TAG
from spark_jobs.executor.reports import SubtaskRestoreReport


def checkpoint_metadata(event: dict[str, Any]) -> dict[str, Any]:
    """A completed checkpoint's metadata: sizes in MiB and durations in ms (plotted by the
    Dagster UI), its identifiers as text."""
    return {
        "checkpoint_id": ident(event["checkpoint_id"]),
        "batch_id": ident(event["batch_id"]),
        "attempt": ident(event["attempt"]),
        "full_size_mib": mib(event["full_size"]),
        "uploaded_mib": mib(event["incremental_size"]),
        "file_count": int(event["file_count"]),
        "sync_ms": float(event["sync_ms"]),
        "async_ms": float(event["async_ms"]),
        "duration_ms": float(event["complete_time_ms"] - event["trigger_time_ms"]),
        "manifest": MetadataValue.path(event["metadata_path"]),
    }


RESTORE_COLUMNS = ["stage", "subtask", "host", "from", "local MiB", "remote MiB", "seconds"]


def started_metadata(
    event: dict[str, Any], first_batch_ms: int, driver_started_ms: int
) -> dict[str, Any]:
    """What an attempt restored: the checkpoint (and the savepoint it was imported from), each
    subtask's host, local and remote bytes (a table), whether it was rescaled and from what,
    the time from the driver's start to its first micro-batch."""
    reports = [SubtaskRestoreReport.from_dict(r) for r in event.get("restore_reports", [])]
    rows = [
        {
            "stage": r.stage,
            "subtask": r.subtask,
            "host": r.host,
            "from": r.source,
            "local MiB": f"{r.bytes_local / MIB:.3f}",
            "remote MiB": f"{r.bytes_remote / MIB:.3f}",
            "seconds": f"{r.duration_ms / 1000:.2f}",
        }
        for r in reports
    ]
    restored = event["restored_from"]
    old = {i for r in reports for i in r.rescaled_from}  # a whole layout: every old subtask
    now = len({r.subtask for r in reports})
    rescaled = {"rescaled": f"from parallelism {max(old) + 1} to {now}"} if old else {}
    return {
        "attempt": ident(event["attempt"]),
        "restored_from": ident(None if restored is None else f"chk-{restored}"),
        **({"savepoint": MetadataValue.path(event["savepoint"])} if event.get("savepoint") else {}),
        **rescaled,
        "subtasks_restored_locally": sum(r.source == "local" for r in reports),
        "subtasks_restored_remotely": sum(r.source == "remote" for r in reports),
        "restored_local_mib": mib(sum(r.bytes_local for r in reports)),
        "restored_remote_mib": mib(sum(r.bytes_remote for r in reports)),
        "restore": md_table(rows, RESTORE_COLUMNS, limit=len(rows)),
        "time_to_first_batch_s": MetadataValue.float(
            round((first_batch_ms - driver_started_ms) / 1000, 2)
        ),
        "allocation": MetadataValue.json(event.get("allocation", {})),
        "first_batch_at": MetadataValue.timestamp(first_batch_ms / 1000),
    }


def takeover_metadata(takeover: dict[str, Any], first_batch_ms: int, number: int) -> dict:
    """A standby's takeover: the driver it replaced, how that one ended, and the seconds from
    the supervisor seeing it end to the end of the new attempt's first micro-batch (plotted)."""
    return {
        "takeover": ident(number),
        "replaced_driver": ident(takeover["from"]),
        "replaced_exit": ident(takeover["exit"]),
        "takeover_s": MetadataValue.float(round((first_batch_ms - takeover["at_ms"]) / 1000, 2)),
    }


class DriverEvents:
    """Turns a driver's (or a standby supervisor's) Pipes messages into Dagster events as they
    arrive; call it with all the messages so far, it handles each once."""

    def __init__(self, context: OpExecutionContext, job_name: str) -> None:
        self.context, self.job_name = context, job_name
        self.seen = 0
        self.driver_started_ms = int(time.time() * 1000)  # until the driver says it is up
        self.started: dict[str, Any] | None = None  # the current attempt's "started" event
        self.first_batch_reported = False
        self.takeover: dict[str, Any] | None = None  # the takeover that began that attempt
        self.takeovers = 0
        self.checkpoints = 0

    def __call__(self, messages: Sequence[Any]) -> None:
        for event in messages[self.seen :]:
            self.seen += 1
            kind = event.get("kind") if isinstance(event, dict) else None
            if kind == "driver" and event.get("standby"):
                self.context.log.info(f"standby driver pid {event['pid']} starting")
            elif kind == "driver":
                self.driver_started_ms = int(time.time() * 1000)
                self._tag({DRIVER_PID_TAG: event["pid"]})
                self.context.log.info(f"driver pid {event['pid']} (kill -9 it to see a restore)")
            elif kind == "drivers":
                self._tag({DRIVER_PID_TAG: event["active"], STANDBY_PID_TAG: event["standby"]})
            elif kind == "takeover":
                self.takeovers += 1
                self.takeover, self.started, self.first_batch_reported = event, None, False
                self.driver_started_ms = int(event["at_ms"])
                self.context.log.warning(
                    f"{self.job_name}: driver {event['from']} exited {event['exit']}; the standby "
                    f"{event['to']} takes over (takeover {self.takeovers} of this run)"
                )
            elif kind == "started":
                self.started = event
            elif kind == "batch" and self.started and not self.first_batch_reported:
                self.first_batch_reported = True
                ended_ms = int(event.get("at_ms") or time.time() * 1000)  # the driver's clock
                metadata = started_metadata(self.started, ended_ms, self.driver_started_ms)
                if self.takeover is not None:
                    metadata.update(takeover_metadata(self.takeover, ended_ms, self.takeovers))
                self._materialize("streaming_jobs", metadata)
            elif kind == "checkpoint":
                self.checkpoints += 1
                self._materialize("completed_checkpoints", checkpoint_metadata(event))
            elif kind == "savepoint":
                self.context.log.info(
                    f"{self.job_name}: savepoint {event['status']} at {event['location']}"
                    + (f": {event['reason']}" if event.get("reason") else "")
                )
            elif kind == "compacted":
                self.context.log.info(
                    f"{self.job_name}: state compacted at checkpoint {event['checkpoint_id']}; a "
                    f"restore reads {event['files_after']} files (before: {event['files_before']})"
                )

    def _tag(self, pids: dict[str, int | None]) -> None:
        """Run tags naming driver processes ("none": no such process now)."""
        tags = {tag: "none" if pid is None else str(pid) for tag, pid in pids.items()}
        self.context.instance.add_run_tags(self.context.run_id, tags)

    def _materialize(self, asset: str, metadata: dict[str, Any]) -> None:
        self.context.log_event(
            AssetMaterialization(asset_key=asset, partition=self.job_name, metadata=metadata)
        )
