"""Savepoints as an asset partitioned by streaming job: materializing it takes one (the running
attempt's next barrier, or a finished job's latest checkpoint: spark_jobs/commands/savepoints.py)
and reports it with every savepoint of the job. ``savepoint_and_stop`` takes one and stops the
job there; the upgrade flow (orchestration/upgrade.py) restarts it from the savepoint.
"""

from typing import Any

from dagster import (
    AssetExecutionContext,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
    define_asset_job,
)
from pydantic import Field

from orchestration.assets.catalog import GROUP, completed_checkpoints
from orchestration.metadata import ident, md_table, mib
from orchestration.partitions import streaming_job_partitions
from orchestration.resources import CutlinePaths, S3Resource
from spark_jobs.commands.savepoints import take_savepoint

SAVEPOINT_COLUMNS = ["status", "location", "checkpoint_id", "batch_id", "size", "code_version",
                     "stopped"]  # fmt: skip


class SavepointConfig(Config):
    """Where the savepoint goes and whether the job stops with it."""

    target: str = Field(default="", description="a directory (path or URL); empty: the root")
    stop: bool = Field(default=False, description="stop the job with the savepoint")
    timeout_s: float = Field(default=600.0, description="how long to wait for the savepoint")


def savepoint_metadata(row: dict[str, Any]) -> dict[str, Any]:
    """One savepoint's metadata: where it is, its size, the checkpoint and code it holds."""
    return {
        "location": MetadataValue.path(row["location"]),
        "size_mib": mib(row["size"] or 0),
        "file_count": int(row["file_count"] or 0),
        "checkpoint_id": ident(row["checkpoint_id"]),
        "batch_id": ident(row["batch_id"]),
        "code_version": ident(row["code_version"] or None),
        "parallelism": int(row["parallelism"]),
        "stopped": bool(row["stopped"]),
        "copy_ms": float(row["copy_ms"] or 0.0),
    }


@asset(
    partitions_def=streaming_job_partitions,
    deps=[completed_checkpoints],
    group_name=GROUP,
    kinds={"delta"},
    description="Savepoints of each streaming job (materialize: take one): location, size, "
    "code version; self-contained, never collected by GC",
)
def savepoints(
    context: AssetExecutionContext,
    config: SavepointConfig,
    cutline_paths: CutlinePaths,
    s3: S3Resource,
) -> MaterializeResult:
    job = context.partition_key
    with s3.environment():
        row = take_savepoint(
            job,
            cutline_paths.paths(),
            target=config.target,
            stop=config.stop,
            timeout_s=config.timeout_s,
            log=context.log.info,
        )
        every = cutline_paths.catalog().savepoints(job)
    listed = [r | {"size": f"{(r['size'] or 0):,}"} for r in every]
    return MaterializeResult(
        metadata=savepoint_metadata(row)
        | {"savepoints": md_table(listed, SAVEPOINT_COLUMNS, limit=20)}
    )


savepoint_and_stop = define_asset_job(
    "savepoint_and_stop",
    selection=[savepoints],
    config={"ops": {"savepoints": {"config": {"stop": True}}}},
    tags={"cutline/kind": "savepoint"},
    description="Stops a streaming job (the partition) with a savepoint: the barrier, the "
    "sinks' commit, a clean FINISHED",
)
