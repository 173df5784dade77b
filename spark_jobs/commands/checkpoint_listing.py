"""The read-only commands over a job's checkpoints: ``cutline checkpoints`` lists them from the
catalog, ``cutline verify`` checks their manifests and files in durable storage."""

from __future__ import annotations

import json

from spark_jobs.catalog.tables import CatalogReader
from state.manifest import ManifestError
from state.paths import JobLayout
from state.restore import read_manifest, validate_checkpoint
from state.storage import StorageError, open_storage


def list_checkpoints(job: str, catalog_root: str, *, as_json: bool = False) -> int:
    """Print ``job``'s checkpoints from the catalog (read with delta-rs; no Spark); 1 if it has
    none."""
    JobLayout(job)  # validates the name
    rows = CatalogReader(catalog_root).checkpoints(job)
    if as_json:
        print(json.dumps([r.to_dict() for r in rows], indent=1))
        return 0
    if not rows:
        print(f"no checkpoints of job {job!r} in the catalog at {catalog_root}")
        return 1
    print(
        f"{'id':>5} {'attempt':>7} {'batch':>6} {'status':9} {'full B':>13} {'uploaded B':>13} "
        f"{'files':>5} {'sync ms':>8} {'async ms':>9}"
    )
    for r in rows:
        print(
            f"{r.checkpoint_id:>5} {r.attempt:>7} {r.batch_id:>6} {r.status.value:9} "
            f"{r.full_size:>13,} {r.incremental_size:>13,} {r.file_count:>5} "
            f"{r.sync_ms:>8.1f} {r.async_ms:>9.1f}"
        )
    return 0


def verify_checkpoints(job: str, checkpoint_root: str, checkpoint_id: int | None = None) -> int:
    """Check ``job``'s manifests (or checkpoint ``checkpoint_id``'s) and every file they name:
    presence, size, checksum. Prints a verdict per checkpoint; 1 if any has a problem."""
    storage = open_storage(checkpoint_root)
    layout = JobLayout(job)
    if checkpoint_id is not None:
        ids = [checkpoint_id]
    else:
        ids = sorted(
            {
                cid
                for info in storage.list(job)
                if info.path.endswith("/" + JobLayout.METADATA)
                and (cid := JobLayout.checkpoint_id_of(info.path.split("/", 1)[1])) is not None
            }
        )
    if not ids:
        print(f"no checkpoints of job {job!r} under {storage.url}")
        return 1
    bad = 0
    for cid in ids:
        path = layout.job_path(layout.metadata(cid))
        try:
            m = read_manifest(storage, path)
            problems = validate_checkpoint(m, storage, checksums=True)
        except (ManifestError, StorageError) as e:
            problems = [str(e)]
        bad += bool(problems)
        verdict = "ok" if not problems else f"{len(problems)} problem(s): {problems[0]}"
        print(f"chk-{cid}: {verdict}")
    return 1 if bad else 0
