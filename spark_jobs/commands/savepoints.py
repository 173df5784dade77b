"""``cutline savepoint JOB``: a savepoint of a job (state/savepoint.py), and the commands that
list and delete savepoints. No Spark.

A job whose last attempt is still running (or failed, and will be restored) gets a request that
its attempt serves at its next barrier (spark_jobs/driver/savepoints.py); the command waits for
the savepoint to be recorded in the catalog. A job whose last attempt finished cleanly has all
its output committed through its latest checkpoint: the command copies that checkpoint itself.
"""

from __future__ import annotations

import json
import time
from typing import Any

from spark_jobs.catalog import open_catalog
from spark_jobs.catalog.tables import CatalogReader, now_ms
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.driver.savepoints import completed_row, savepoint_location
from spark_jobs.errors import ConfigurationError
from spark_jobs.job_loader import get_job
from state.catalog import CheckpointStatus
from state.paths import JobLayout, SavepointLayout
from state.restore import read_manifest
from state.savepoint import (
    SavepointError,
    SavepointRequest,
    delete_savepoint,
    write_request,
    write_savepoint,
)
from state.storage import StorageError, open_storage


class SavepointFailedError(RuntimeError):
    """The job could not write the savepoint it was asked for (exit 1; the job goes on)."""


def take_savepoint(
    job_ref: str,
    paths: RuntimePaths,
    *,
    target: str = "",
    stop: bool = False,
    timeout_s: float = 600.0,
    log=print,
) -> dict[str, Any]:
    """A savepoint of job ``job_ref`` into the directory ``target`` (default: the savepoint
    root); with ``stop`` the job stops there. Returns its catalog row."""
    job = get_job(job_ref)
    reader = CatalogReader(paths.catalog)
    attempts = reader.jobs(job.name)
    if not attempts:
        raise ConfigurationError(f"{job.name} has never run: there is nothing to save")
    request = SavepointRequest.new(target, stop, now_ms())
    if attempts[-1]["status"] == "FINISHED":
        return _from_latest(job, paths, request, log)
    write_request(open_storage(paths.checkpoint_root), JobLayout(job.name), request)
    how = "stop with savepoint" if stop else "savepoint"
    log(f"{how} requested of {job.name} attempt {attempts[-1]['attempt']}: waiting")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = [r for r in reader.savepoints(job.name) if r["request_id"] == request.request_id]
        if rows:
            return _outcome(rows[0])
        time.sleep(1.0)
    raise SavepointFailedError(
        f"no savepoint of {job.name} within {timeout_s:.0f} s; the request stays for its next "
        "barrier (or, once the job is idle, its latest committed checkpoint)"
    )


def _from_latest(job, paths: RuntimePaths, request: SavepointRequest, log) -> dict[str, Any]:
    """A finished job: its latest completed checkpoint, copied by this process."""
    catalog = open_catalog(paths.catalog)
    rows = catalog.checkpoints(job.name, (CheckpointStatus.COMPLETED,))
    if not rows:
        raise ConfigurationError(f"{job.name} has no completed checkpoint to save")
    storage = open_storage(paths.checkpoint_root)
    manifest = read_manifest(storage, rows[-1].metadata_path)
    location = savepoint_location(job, request, paths.savepoints, manifest.checkpoint_id)
    row = completed_row(job, request, write_savepoint(manifest, storage, open_storage(location)))
    catalog.record_savepoint(row)
    log(f"{job.name} is not running: its latest checkpoint {manifest.checkpoint_id} saved")
    return row


def _outcome(row: dict[str, Any]) -> dict[str, Any]:
    if row["status"] != "COMPLETED":
        raise SavepointFailedError(f"the savepoint into {row['location']} failed: {row['reason']}")
    return row


def dispose_savepoint(job_ref: str, paths: RuntimePaths, location: str) -> int:
    """Delete the savepoint at ``location`` and mark it DELETED in the catalog; returns the
    files deleted."""
    job = get_job(job_ref)
    try:
        target = open_storage(location)
        deleted = delete_savepoint(target)
    except (SavepointError, ValueError) as e:
        raise ConfigurationError(str(e)) from None
    open_catalog(paths.catalog).set_savepoint_status(job.name, target.url, "DELETED")
    return deleted


def list_savepoints(job_ref: str, paths: RuntimePaths, *, as_json: bool = False) -> int:
    """Print the job's savepoints, oldest first."""
    job = get_job(job_ref)
    rows = CatalogReader(paths.catalog).savepoints(job.name)
    if as_json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print(f"{job.name} has no savepoints")
    for r in rows:
        held = (
            f"  checkpoint {r['checkpoint_id']} batch {r['batch_id']}  {r['size']:,} B in "
            f"{r['file_count']} files"
            if r["checkpoint_id"] is not None
            else ""
        )
        print(
            f"{r['status']:<9} {r['location']}{held}"
            + (f"  job version {r['code_version']}" if r["code_version"] else "")
            + ("  (stopped)" if r["stopped"] else "")
            + (f"  {r['reason']}" if r["reason"] else "")
            + ("" if r["status"] != "COMPLETED" or _still_there(r["location"]) else GONE)
        )
    return 0


GONE = "  (no longer there: moved or deleted; restore it from where it is now)"


def _still_there(location: str) -> bool:
    """Whether the savepoint written at ``location`` is still there (its ``_metadata``); one
    whose storage cannot be reached now counts as there (the listing is from the catalog)."""
    try:
        return open_storage(location).exists(SavepointLayout.METADATA)
    except StorageError:
        return True
