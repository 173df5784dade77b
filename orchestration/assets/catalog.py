"""The catalog's Delta tables as partitioned assets (one partition per streaming job), with the
lineage ``streaming_jobs`` -> ``completed_checkpoints`` -> ``shared_state_files``.

Streaming runs report materializations of ``streaming_jobs`` (an attempt started processing)
and ``completed_checkpoints`` (each checkpoint, with its figures) as they happen; materializing
an asset here reads its table for the partition and reports a summary.
"""

from collections import Counter

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from orchestration.partitions import streaming_job_partitions
from orchestration.resources import CutlinePaths

GROUP = "cutline_catalog"


def _table(rows: list[dict], columns: list[str], limit: int = 10) -> MetadataValue:
    """The last ``limit`` rows as a Markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows[-limit:]:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return MetadataValue.md("\n".join(lines))


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
            "latest_attempt": latest.get("attempt", 0),
            "latest_status": latest.get("status", "NONE"),
            "attempts_table": _table(
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
            "latest_checkpoint_id": latest.checkpoint_id if latest else -1,
            "latest_full_size_bytes": latest.full_size if latest else 0,
            "checkpoints_table": _table(
                [r.to_dict() | {"status": r.status.value} for r in rows],
                [
                    "checkpoint_id",
                    "attempt",
                    "batch_id",
                    "status",
                    "full_size",
                    "incremental_size",
                    "file_count",
                ],
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
            "live_bytes": sum(r["size"] for r in live),
            "deleted_files": len(rows) - len(live),
            "table": MetadataValue.path(catalog.path("shared_state_files")),
        }
    )
