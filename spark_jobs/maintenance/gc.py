"""Retention GC of one job (``cutline gc JOB``; the Dagster retention job runs the same).

One pass: mark COMPLETED checkpoints beyond ``num_retained`` SUBSUMED, list the job's root in
primary storage, delete what :func:`state.gc.plan_gc` says no checkpoint needs (unreferenced
shared files, private files of subsumed checkpoints, orphans; all older than the grace period),
prune local copies of checkpoints that are gone, and bring ``shared_state_files`` up to date
with what is stored (refcount, last used, DELETED with time, rows for files it lacks) in one
commit that the running job's appends of new rows cannot fail (spark_jobs/catalog/shared_files.py):
GC completes beside a job however often it checkpoints.

Crash safety: every step is idempotent and recomputed from storage and the catalog, so a pass
killed at any point leaves nothing referenced deleted, and the next pass finishes the work.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spark_jobs.catalog import catalog_exists, open_catalog
from spark_jobs.catalog.checkpoint_root import check_root
from spark_jobs.catalog.shared_files import RegistryChanges
from spark_jobs.catalog.tables import now_ms
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.errors import ConfigurationError
from spark_jobs.job_loader import get_job
from state.acks import Ack, AckError, ack_location
from state.gc import GcPlan, Retention, plan_gc, select_retention
from state.manifest import CheckpointManifest, ManifestError
from state.paths import JobLayout
from state.registry import StoredFile
from state.restore import read_manifest
from state.storage import MissingFileError, StorageError, open_storage


@dataclass
class GcReport:
    job: str
    dry_run: bool
    subsumed: list[int] = field(default_factory=list)
    retained: list[int] = field(default_factory=list)
    protected: list[int] = field(default_factory=list)
    files_deleted: int = 0
    bytes_reclaimed: int = 0
    shared_files_live: int = 0
    shared_bytes_live: int = 0
    stored_bytes: int = 0  # under the job's root after the pass
    catalog_rows_updated: int = 0  # registry rows changed or added
    registry_replans: int = 0  # registry rewrites planned again: a concurrent commit removed files
    conflicts_retried: int = 0  # other catalog writes (subsumption) done again after a conflict
    local_copies_pruned: int = 0
    grace_s: float = 0.0
    grace_kept_files: int = 0  # deletable but for the grace period
    grace_kept_bytes: int = 0
    grace_until_ms: int = 0  # a pass after this deletes them, if nothing needs them by then
    duration_ms: float = 0.0
    phase_ms: dict[str, float] = field(default_factory=dict)  # where the time went

    def lap(self, phase: str, since: float) -> float:
        """Record the time since ``since`` as ``phase``; returns now."""
        now = time.perf_counter()
        self.phase_ms[phase] = round((now - since) * 1000, 1)
        return now

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def collect_garbage(
    job_ref: str,
    paths: RuntimePaths,
    *,
    dry_run: bool = False,
    grace_s: float | None = None,
    log=print,
) -> GcReport:
    """One GC pass over the job ``job_ref`` (a name or ``module:attr``, as ``get_job`` takes;
    see the module docstring). The grace period defaults to the checkpoint timeout: a pending
    checkpoint lives at most that long, so its uploads are safe for that long."""
    started = time.perf_counter()
    job = get_job(job_ref)
    job_name = job.name
    grace = job.checkpoint.timeout_ms / 1000 if grace_s is None else grace_s
    if not catalog_exists(paths.catalog):
        # without the catalog every stored file would look unreferenced: refuse, delete nothing
        raise ConfigurationError(
            f"{job_name}: no catalog under {paths.warehouse} (is the warehouse right?); GC "
            "needs the catalog's checkpoints to know what is referenced, and deletes nothing"
        )
    catalog = open_catalog(paths.catalog)  # reads and commits through delta-rs: no Spark
    storage = open_storage(paths.checkpoint_root)
    check_root(catalog, storage, job_name, paths.checkpoint_root)  # a wrong root: said at once
    layout = JobLayout(job_name)
    report = GcReport(job_name, dry_run, grace_s=grace)

    # First what is stored, with the acks of pending checkpoints; then the catalog (see plan_gc)
    prefix = job_name + "/"
    listing = [
        StoredFile(info.path[len(prefix) :], info.size, info.modified)
        for info in storage.list(job_name)
    ]
    pending_paths = _acked_paths(storage, layout, listing)
    _fault_point("listed")
    mark = report.lap("list storage", started)
    now = now_ms()
    rows = catalog.checkpoints(job_name)
    attempts = catalog.jobs(job_name)
    current = attempts[-1] if attempts else None
    running = current is not None and current["status"] == "RUNNING"
    restored_from = current["restored_from"] if current else None
    restored_done = restored_from is None or any(
        r.attempt == current["attempt"] and r.checkpoint_id > restored_from for r in rows
    )
    retain = dict(
        num_retained=job.checkpoint.num_retained,
        now_ms=now,
        restored_from=restored_from,
        restored_done=restored_done,
    )
    retention = select_retention(rows, grace_s=grace, **retain)
    report.subsumed, report.retained = retention.subsume, retention.retained
    report.protected = retention.protected
    if retention.subsume and not dry_run:
        catalog.mark_subsumed(job_name, retention.subsume)
    _fault_point("subsumed")
    mark = report.lap("read checkpoints, subsume", mark)

    by_id = {r.checkpoint_id: r for r in rows}
    manifests = {}
    for cid in retention.protected:
        try:
            manifests[cid] = read_manifest(storage, by_id[cid].metadata_path)
        except (ManifestError, StorageError) as e:
            raise RuntimeError(
                f"{job_name}: checkpoint {cid} is protected but its manifest is unreadable ({e});"
                " GC deletes nothing until it is repaired or a restore marks it CORRUPT"
            ) from e
    latest = max(retention.retained, default=0)
    mark = report.lap("read manifests", mark)
    plan = plan_gc(
        retention, manifests, listing, latest_completed=latest, now_ms=now, grace_s=grace,
        running=running, pending_paths=pending_paths,
    )  # fmt: skip
    without = select_retention(rows, grace_s=0, **retain)
    _grace_kept(report, plan, without, manifests, listing, now, latest, running, pending_paths)
    mark = report.lap("plan", mark)
    report.files_deleted = len(plan.delete)
    report.bytes_reclaimed = plan.bytes_reclaimed
    gone = {f.path for f in plan.delete}
    report.stored_bytes = sum(f.size for f in listing if f.path not in gone)
    if dry_run:
        log(f"{job_name}: would delete {len(plan.delete)} files ({plan.bytes_reclaimed:,} B)")
    elif plan.delete:
        targets = [layout.job_path(f.path) for f in plan.delete]
        pause = os.environ.get(FAULT_PAUSE, "")
        if pause.startswith("deleting:"):  # some deleted, the rest not: a kill mid-delete
            storage.delete_many(targets[: int(pause.split(":")[1])])
            _fault_point(pause)
        storage.delete_many(targets)
        _fault_point("deleted")

    present = {f.path for f in listing} - gone
    mark = report.lap("delete", mark)

    def exists(path: str) -> bool:
        return storage.exists(layout.job_path(path))

    def changes(rows: list[dict[str, Any]]) -> RegistryChanges:
        """The registry's changes, planned on the job's rows as of one table version (again on
        each version the rewrite is planned on); the report counts the last plan's."""
        diff, live, live_bytes = _registry_changes(
            job_name, rows, plan, manifests, latest, gone, present, now, exists
        )
        report.shared_files_live, report.shared_bytes_live = live, live_bytes
        report.catalog_rows_updated = len(diff.updates) + len(diff.inserts)
        _hold_plan()
        return diff

    if dry_run:
        changes(catalog.shared_files(job_name))
        report.lap("read registry, diff", mark)
    else:
        _fault_point("updating", stop=False)  # the test kills the pass inside the rewrite
        rewrite = catalog.update_shared_files(job_name, changes)
        report.registry_replans = rewrite.conflicts
        _fault_point("updated")  # new rows are in the same commit as the updates
        _fault_point("recorded")
        mark = report.lap("update registry", mark)
        report.local_copies_pruned = prune_local_copies(
            paths.local_state_root, job_name, set(retention.protected), latest
        )
        report.lap("prune local copies", mark)
    report.conflicts_retried = catalog.conflicts_retried
    report.duration_ms = (time.perf_counter() - started) * 1000
    return report


def _grace_kept(
    report: GcReport,
    plan: GcPlan,
    without: Retention,
    manifests: dict[int, CheckpointManifest],
    listing: list[StoredFile],
    now: int,
    latest: int,
    running: bool,
    pending: set[str],
) -> None:
    """What the grace period alone keeps: the files a pass without it (``without``: the
    retention chosen with no grace) would also delete, files younger than it and those of
    checkpoints subsumed within it; counted in ``report``. Each becomes deletable within the
    grace period from now."""
    if report.grace_s <= 0:
        return
    ungraced = plan_gc(
        without, manifests, listing, latest_completed=latest, now_ms=now, grace_s=0,
        running=running, pending_paths=pending,
    )  # fmt: skip
    deleted = {f.path for f in plan.delete}
    kept = [f for f in ungraced.delete if f.path not in deleted]
    report.grace_kept_files = len(kept)
    report.grace_kept_bytes = sum(f.size for f in kept)
    report.grace_until_ms = now + int(report.grace_s * 1000) if kept else 0


FAULT_PAUSE = "CUTLINE_FAULT_GC_PAUSE"
FAULT_PAUSED = "CUTLINE_FAULT_GC_PAUSED"
# seconds each registry plan takes longer: the window between reading the registry and
# committing its changes, in which the running job keeps appending rows
FAULT_PLAN_DELAY_S = "CUTLINE_FAULT_GC_PLAN_DELAY_S"
# a file: each registry plan, once made, creates ``<file>.planned`` and waits until the test
# creates ``<file>`` (so the test decides what lands between the plan's read and its commit)
FAULT_PLAN_GATE = "CUTLINE_FAULT_GC_PLAN_GATE"
FAULT_POINTS = (
    "listed", "subsumed", "deleting:<n>", "deleted", "updating", "updated", "recorded"
)  # fmt: skip


def _hold_plan() -> None:
    """Fault injection for concurrency tests: a registry plan held open
    (:data:`FAULT_PLAN_DELAY_S` seconds, then until :data:`FAULT_PLAN_GATE` opens)."""
    time.sleep(float(os.environ.get(FAULT_PLAN_DELAY_S) or 0))
    gate = os.environ.get(FAULT_PLAN_GATE)
    if gate:
        Path(f"{gate}.planned").touch()
        while not Path(gate).exists():
            time.sleep(0.05)


def _fault_point(point: str, *, stop: bool = True) -> None:
    """Fault injection for crash tests: with ``CUTLINE_FAULT_GC_PAUSE=<point>`` (one of
    :data:`FAULT_POINTS`) the pass creates the file ``CUTLINE_FAULT_GC_PAUSED`` names when it
    gets here and, if ``stop``, waits for the test to ``kill -9`` it (else the test kills it
    while it goes on)."""
    if os.environ.get(FAULT_PAUSE) != point:
        return
    Path(os.environ[FAULT_PAUSED]).touch()
    while stop:
        time.sleep(3600)


def _registry_changes(
    job_name: str,
    rows: list[dict[str, Any]],
    plan: GcPlan,
    manifests: dict,
    latest: int,
    gone: set[str],
    present: set[str],
    now: int,
    exists: Callable[[str], bool],
) -> tuple[RegistryChanges, int, int]:
    """What brings the registry (``rows``) in line with storage after the pass: every LIVE row's
    status, refcount and last use, and rows for stored files it lacks. Returns the changes and
    the LIVE files and bytes after them."""
    missing = _missing_rows(job_name, manifests, latest, {r["path"] for r in rows}, present)
    for row in missing:
        row["refcount"] = plan.refcounts.get(row["path"], 0)
    live, live_bytes = len(missing), sum(r["size"] for r in missing)
    updates = {}
    for row in rows:
        if row["status"] != "LIVE":
            continue
        path = row["path"]
        # absent from the listing: deleted (now or by a killed pass), or uploaded after the
        # listing was taken; names are never reused, so storage decides
        if path in gone or (path not in present and not exists(path)):
            update = {"status": "DELETED", "deleted_at_ms": now, "refcount": 0}
        else:
            update = {"status": "LIVE", "deleted_at_ms": None}
            update["refcount"] = plan.refcounts.get(path, 0)
            live += 1
            live_bytes += row["size"]
        update["last_used"] = max(row["last_used"] or 0, plan.last_used.get(path, 0))
        if any(update[k] != row[k] for k in update):
            updates[path] = update
    return RegistryChanges(updates, missing), live, live_bytes


def _missing_rows(
    job_name: str, manifests: dict, latest: int, known: set[str], present: set[str]
) -> list[dict[str, Any]]:
    """Rows for stored shared files that checkpoints before the latest reference but the catalog
    lacks (a driver killed between a checkpoint's commit and recording its new files). Files
    of the latest checkpoint are left to the driver, which may be recording them right now."""
    rows: dict[str, dict[str, Any]] = {}
    for cid in sorted(manifests):
        m = manifests[cid]
        for h in m.subtasks:
            for f in h.files:
                if not f.shared or f.path in known or f.path not in present:
                    continue
                row = rows.get(f.path)
                if row is None and cid < latest:
                    rows[f.path] = {
                        "job_id": job_name, "path": f.path, "operator": h.operator,
                        "subtask": h.subtask, "size": f.stored_size, "created_by": cid,
                        "last_used": cid, "refcount": 0, "status": "LIVE",
                    }  # fmt: skip
                elif row is not None:
                    row["last_used"] = cid
    return list(rows.values())


def _acked_paths(storage, layout: JobLayout, listing: list[StoredFile]) -> set[str]:
    """Files referenced by the acks of pending checkpoints (subtasks that finished uploading),
    of every attempt: a zombie's pending uploads are protected like any other."""
    paths: set[str] = set()
    for f in listing:
        if ack_location(f.path) is None:
            continue
        try:
            ack = Ack.from_json(storage.get_bytes(layout.job_path(f.path)), source=f.path)
        except MissingFileError:  # its checkpoint completed meanwhile: the catalog has it
            continue
        except AckError:  # not an ack GC can read: it protects nothing, and stays
            continue
        if ack.handle is not None:
            paths |= {sf.path for sf in ack.handle.files}
    return paths


def prune_local_copies(root: str, job_name: str, keep: set[int], latest: int) -> int:
    """Delete this host's local copies of checkpoints that are neither kept nor possibly pending
    (ids above ``latest``). Returns how many were deleted."""
    pruned = 0
    for copy in Path(root, job_name).glob("*/*/chk-*"):
        cid = JobLayout.checkpoint_id_of(copy.name)
        if cid is not None and cid not in keep and cid <= latest and copy.is_dir():
            shutil.rmtree(copy, ignore_errors=True)
            pruned += 1
    return pruned
