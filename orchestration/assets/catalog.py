"""The catalog's Delta tables as partitioned assets (one partition per streaming job), with the
lineage ``streaming_jobs`` -> ``completed_checkpoints`` -> ``shared_state_files``.

Streaming runs report materializations of ``streaming_jobs`` (an attempt started processing)
and ``completed_checkpoints`` (each checkpoint, with its figures) as they happen; materializing
an asset here reads its table for the partition and reports a summary.
"""

from collections import Counter

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from orchestration.metadata import MIB, ident, md_table, mib
from orchestration.partitions import streaming_job_partitions
from orchestration.resources import CutlinePaths

GROUP = "cutline_catalog"
CHECKPOINT_COLUMNS = ["checkpoint_id", "attempt", "batch_id", "status", "full MiB",
                      "uploaded MiB", "file_count"]  # fmt: skip


@asset(
    partitions_def=streaming_job_partitions,
    group_name=GROUP,
    kinds={"delta", "spark"},
    description="Attempts of each streaming job: status, restored-from checkpoint, allocation",
)
def streaming_jobs(
    context: AssetExecutionContext, cutline_paths: CutlinePaths
) -> MaterializeResult:
    catalog = cutline_paths.catalog()
    rows = catalog.jobs(context.partition_key)
    latest = rows[-1] if rows else {}
    return MaterializeResult(
        metadata={
            "attempts": len(rows),
            "latest_attempt": ident(latest.get("attempt")),
            "latest_status": latest.get("status", "NONE"),
            "attempts_table": md_table(
                rows, ["attempt", "run_id", "status", "restored_from", "failure_reason"]
            ),
            "table": MetadataValue.path(catalog.path("streaming_jobs")),
        }
    )


@asset(
    partitions_def=streaming_job_partitions,
    deps=[streaming_jobs],
    group_name=GROUP,
    kinds={"delta"},
    description="Completed checkpoints: positions, manifest, sizes, durations, status",
)
def completed_checkpoints(
    context: AssetExecutionContext, cutline_paths: CutlinePaths
) -> MaterializeResult:
    catalog = cutline_paths.catalog()
    rows = catalog.checkpoints(context.partition_key)
    by_status = Counter(r.status.value for r in rows)
    latest = max(
        (r for r in rows if r.status.value == "COMPLETED"),
        default=None,
        key=lambda r: r.checkpoint_id,
    )
    return MaterializeResult(
        metadata={
            "completed": by_status.get("COMPLETED", 0),
            "subsumed": by_status.get("SUBSUMED", 0),
            "corrupt": by_status.get("CORRUPT", 0),
            "latest_checkpoint_id": ident(latest.checkpoint_id if latest else None),
            "latest_full_size_mib": mib(latest.full_size if latest else 0),
            "checkpoints_table": md_table(
                [
                    r.to_dict()
                    | {
                        "status": r.status.value,
                        "full MiB": f"{r.full_size / MIB:.3f}",
                        "uploaded MiB": f"{r.incremental_size / MIB:.3f}",
                    }
                    for r in rows
                ],
                CHECKPOINT_COLUMNS,
            ),
            "table": MetadataValue.path(catalog.path("completed_checkpoints")),
        }
    )


@asset(
    partitions_def=streaming_job_partitions,
    deps=[completed_checkpoints],
    group_name=GROUP,
    kinds={"delta"},
    description="Shared (incremental) state files: size, creating checkpoint, refcount, status",
)
def shared_state_files(
    context: AssetExecutionContext, cutline_paths: CutlinePaths
) -> MaterializeResult:
    catalog = cutline_paths.catalog()
    rows = catalog.shared_files(context.partition_key)
    live = [r for r in rows if r["status"] == "LIVE"]
    return MaterializeResult(
        metadata={
            "live_files": len(live),
            "live_mib": mib(sum(r["size"] for r in live)),
            "deleted_files": len(rows) - len(live),
            "table": MetadataValue.path(catalog.path("shared_state_files")),
        }
    )
