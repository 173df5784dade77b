"""Retention GC benchmark: one job's catalog and primary storage at scale, collected by the real
GC pass (``spark_jobs.maintenance.gc.collect_garbage``) on local Spark and the local filesystem.

The job (clicks_per_user: 2 subtasks, 2 retained) has ``--checkpoints`` checkpoints; each
uploaded ``--shared-files / --checkpoints`` new shared SST files and 3 private files per subtask,
and references the shared files of the last ``--window`` checkpoints. All but the retained ones
are SUBSUMED (the coordinator marks them at completion) and GC never ran: every file is still
stored and every ``shared_state_files`` row LIVE. Timed passes:

- ``dry_run``: list, read the catalog and the retained manifests, plan; delete nothing;
- ``catch_up``: the same, deleting everything no retained checkpoint needs and marking those
  registry rows DELETED in one commit (a rewrite of the registry files holding them);
- ``steady``: the next pass, with nothing left to delete.

Prints each pass's report (with ``phase_ms``, where the time went) and writes them with the
setup to bench/results/gc.json.

    .venv/bin/python bench/gc_bench.py --checkpoints 1000 --shared-files 100000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spark_jobs.catalog.delta_catalog import DeltaCatalog  # noqa: E402
from spark_jobs.catalog.tables import now_ms  # noqa: E402
from spark_jobs.deploy.session import build_spark  # noqa: E402
from spark_jobs.deploy.settings import RuntimePaths  # noqa: E402
from spark_jobs.job_loader import get_job  # noqa: E402
from spark_jobs.maintenance.gc import collect_garbage  # noqa: E402
from state.catalog import CheckpointStatus, CompletedCheckpoint  # noqa: E402
from state.handles import StateFile, SubtaskStateHandle  # noqa: E402
from state.keygroups import key_group_range  # noqa: E402
from state.manifest import CheckpointManifest  # noqa: E402
from state.paths import JobLayout  # noqa: E402

JOB = "clicks_per_user"
PRIVATE = ("CURRENT", "MANIFEST-000001", "OPTIONS-000002")
FILE_BYTES = 64  # contents do not matter to GC; sizes are what the catalog reports


def build(paths: RuntimePaths, spark, checkpoints: int, shared_files: int, window: int) -> dict:
    """Write the job's files, manifests and catalog rows; returns what was built."""
    job = get_job(JOB)
    op, parallelism = job.stages[0].name, job.parallelism
    layout = JobLayout(JOB)
    root = Path(paths.checkpoint_root)
    per_subtask = shared_files // checkpoints // parallelism
    payload = b"x" * FILE_BYTES
    old = time.time() - 86_400  # everything older than any grace period
    uploads: dict[tuple[int, int], list[StateFile]] = {}  # (checkpoint, subtask) -> its SSTs
    rows, registry = [], []
    start_ms = now_ms() - 86_400_000
    for cid in range(1, checkpoints + 1):
        token = uuid.uuid4().hex[:16]
        handles = []
        for sub in range(parallelism):
            new = [
                StateFile(
                    f"{cid * 1000 + i:06d}.sst",
                    layout.shared_file(op, sub, f"{cid * 1000 + i:06d}-{token}.sst"),
                    FILE_BYTES,
                    "crc32:00000000",
                )
                for i in range(per_subtask)
            ]
            uploads[(cid, sub)] = new
            private = [
                StateFile(n, layout.private_file(cid, op, sub, f"{n}.{token}"), FILE_BYTES, "-")
                for n in PRIVATE
            ]
            for f in new + private:
                target = root / JOB / f.path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(payload)
                os.utime(target, (old, old))
            registry += [
                {"job_id": JOB, "path": f.path, "operator": op, "subtask": sub, "size": f.size,
                 "created_by": cid, "last_used": cid, "refcount": 1, "status": "LIVE"}
                for f in new
            ]  # fmt: skip
            chain = [f for c in range(max(1, cid - window + 1), cid + 1) for f in uploads[(c, sub)]]
            handles.append(
                SubtaskStateHandle(
                    op, sub, key_group_range(sub, parallelism, job.max_parallelism), cid,
                    tuple(chain + private), uploaded_bytes=FILE_BYTES * len(new + private),
                )
            )  # fmt: skip
        manifest = CheckpointManifest(JOB, cid, cid, 1, start_ms + cid * 3000, {}, tuple(handles))
        metadata = root / layout.job_path(layout.metadata(cid))
        metadata.write_bytes(manifest.to_json())
        os.utime(metadata, (old, old))
        rows.append(
            CompletedCheckpoint(
                JOB, cid, cid, 1, start_ms + cid * 3000, start_ms + cid * 3000 + 500,
                layout.job_path(layout.metadata(cid)), manifest.full_size,
                manifest.uploaded_bytes, manifest.file_count, 5.0, 50.0,
                status=CheckpointStatus.COMPLETED
                if cid > checkpoints - job.checkpoint.num_retained
                else CheckpointStatus.SUBSUMED,
            )
        )  # fmt: skip
    catalog = DeltaCatalog(paths.catalog)
    attempt = catalog.begin_attempt(JOB, run_id="gc-bench")
    catalog.import_checkpoints(rows)
    catalog.record_shared_files(registry)
    catalog.set_job_status(JOB, attempt, "FINISHED")
    return {
        "checkpoints": checkpoints,
        "retained": job.checkpoint.num_retained,
        "shared_files": len(registry),
        "private_files": checkpoints * parallelism * len(PRIVATE),
        "files_per_retained_manifest": rows[-1].file_count,
        "window": window,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--shared-files", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=10, help="checkpoints a manifest spans")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "gc.json"))
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cutline-gc-bench-"))
    paths = RuntimePaths.under(work)
    spark = build_spark(args.master, "cutline-gc-bench")
    try:
        started = time.perf_counter()
        setup = build(paths, spark, args.checkpoints, args.shared_files, args.window)
        setup["build_s"] = round(time.perf_counter() - started, 1)
        print("setup", json.dumps(setup), flush=True)
        results = {"setup": setup}
        for name, dry in (("dry_run", True), ("catch_up", False), ("steady", False)):
            report = collect_garbage(JOB, paths, dry_run=dry, grace_s=0, log=lambda *_: None)
            results[name] = {
                "duration_s": round(report.duration_ms / 1000, 2),
                "files_deleted": report.files_deleted,
                "bytes_reclaimed": report.bytes_reclaimed,
                "catalog_rows_updated": report.catalog_rows_updated,
                "shared_files_live": report.shared_files_live,
                "phase_ms": report.phase_ms,
            }
            print(name, json.dumps(results[name]), flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
