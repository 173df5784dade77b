"""Savepoints on the driver: taking one when asked, and starting an attempt from one.

Taking one (``cutline savepoint JOB``, spark_jobs/commands/savepoints.py, stores the request
beside the job's checkpoints). The stream thread reads the request when it triggers a
checkpoint, as it reads a compaction request: that checkpoint serves it; with ``stop``, the run
stops instead and its final checkpoint serves it (Flink's stop-with-savepoint: the barrier, the
sinks' commit, a clean FINISHED). Once the serving checkpoint is complete and its output
committed (driver/completion.py), the ack thread copies it into the savepoint directory
(state/savepoint.py; inside the storage service where it can), records the savepoint in the
catalog and clears the request. Until then the checkpoint is the latest completed one, which
nothing subsumes, so GC cannot take its files away mid-copy. A savepoint that cannot be
written is recorded FAILED; the job goes on.

Starting from one (``cutline run JOB --restore URL``): :func:`start_from_savepoint` checks the
savepoint (every file's size and checksum) and the job's state schema against it, then imports
it as a new checkpoint of the job. The attempt restores that checkpoint as any other.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from cutline.job import JobDefinition
from cutline.sinks import SinkWriter
from spark_jobs.catalog.tables import now_ms
from spark_jobs.driver.evolution import check_restorable
from spark_jobs.driver.new_history import begin_new_history
from spark_jobs.driver.run_state import RunState, SavepointSlot, ServedSavepoint
from spark_jobs.errors import (
    ConfigurationError,
    IncompatibleStateError,
    NoRestorableCheckpointError,
)
from spark_jobs.events import EventChannel
from state.catalog import CompletedCheckpoint, JobCatalog, shared_file_rows
from state.claims import claim_checkpoint_id
from state.faults import kill_point
from state.manifest import CheckpointManifest
from state.paths import JobLayout, SavepointLayout
from state.savepoint import (
    SAVEPOINT_REQUEST,
    SavepointError,
    SavepointInfo,
    SavepointRequest,
    clear_request,
    delete_savepoint,
    import_savepoint,
    note_writing,
    noted_writing,
    read_request,
    read_savepoint,
    write_savepoint,
)
from state.storage import AccessError, DurableStorage, StorageError, open_storage
from state.storage.tables import join_url


def is_location(restore: str | int | None) -> bool:
    """Whether a ``--restore`` choice names a savepoint directory (a path or a URL), not
    ``latest`` or a checkpoint id."""
    return isinstance(restore, str) and ("/" in restore or "://" in restore)


def savepoint_row(job: JobDefinition, request: SavepointRequest, location: str, **values) -> dict:
    """A ``savepoints`` catalog row; ``values`` fill the figures, status and reason."""
    row = {
        "job_id": job.name,
        "request_id": request.request_id,
        "location": location,
        "code_version": job.version,
        "parallelism": job.parallelism,
        "created_ms": now_ms(),
        "stopped": request.stop,
        "reason": "",
    }
    return row | values


def completed_row(job: JobDefinition, request: SavepointRequest, info: SavepointInfo) -> dict:
    """The ``savepoints`` row of a savepoint written."""
    return savepoint_row(
        job,
        request,
        info.location,
        checkpoint_id=info.checkpoint_id,
        batch_id=info.batch_id,
        size=info.size,
        file_count=info.file_count,
        copy_ms=round(info.seconds * 1000, 1),
        status="COMPLETED",
    )


def savepoint_location(
    job: JobDefinition, request: SavepointRequest, savepoint_root: str, checkpoint_id: int
) -> str:
    """Where a savepoint of checkpoint ``checkpoint_id`` goes: under the request's target, or
    the savepoint root's directory of the job."""
    directory = request.target or join_url(savepoint_root, job.name)
    return join_url(directory, f"savepoint-{checkpoint_id}-{request.request_id}")


class SavepointRequests:
    """Serves the job's savepoint request, one at a time (the slot is the run state's:
    driver/run_state.py)."""

    def __init__(
        self,
        job: JobDefinition,
        storage: DurableStorage,
        catalog: JobCatalog,
        savepoint_root: str,
        state: RunState,
        log: Callable[[str], None],
        events: EventChannel,
    ) -> None:
        self.job, self.storage, self.catalog = job, storage, catalog
        self.layout = JobLayout(job.name)
        self.savepoint_root = savepoint_root
        self.state, self.log, self.events = state, log, events

    def _unserved(self) -> SavepointRequest | None:
        """The stored request, unless an earlier attempt recorded its savepoint and died before
        clearing it (cleared now: a request is served once)."""
        request = read_request(self.storage, self.layout)
        if request is None:
            return None
        rows = self.catalog.savepoints(self.job.name)
        if any(r["request_id"] == request.request_id and r["status"] == "COMPLETED" for r in rows):
            self.log(f"savepoint request {request.request_id} was served already: cleared")
            clear_request(self.storage, self.layout, request.request_id)
            return None
        return request

    def _pending(self, slot: SavepointSlot) -> SavepointRequest | None:
        """The pending request, unless one is served already."""
        return None if slot.serving is not None else self._read()

    def _read(self) -> SavepointRequest | None:
        """The unserved request, if any: a malformed one is removed, an unreadable one is
        looked at again next time, each said in the log."""
        try:
            return self._unserved()
        except SavepointError as e:
            self.log(f"{e}: removed")
            self.storage.delete(self.layout.job_path(SAVEPOINT_REQUEST))
        except StorageError as e:
            self.log(f"savepoint request unreadable: {e}")
        return None

    def at_barrier(self, checkpoint_id: int | None) -> None:
        """Checkpoint ``checkpoint_id`` is triggered (the stream thread): a pending request is
        served by it, or, with ``stop``, by the final checkpoint after the run stops here."""
        if checkpoint_id is None:
            return
        with self.state.savepoint() as slot:
            request = self._pending(slot)
            if request is not None:
                slot.serving = ServedSavepoint(request, None if request.stop else checkpoint_id)
        if request is not None and request.stop:
            self.log("stop with savepoint: the run stops; its final checkpoint is the savepoint")
            self.state.stop.set()
        elif request is not None:
            self.log(f"checkpoint {checkpoint_id} will be copied into a savepoint")

    def when_idle(self, committed: CheckpointManifest | None, pending: bool) -> bool:
        """No micro-batch runs (the main thread; a job without new input reaches no barrier):
        whether a stop-with-savepoint is requested. Any other request is served now from
        ``committed``, the latest checkpoint whose output is committed, unless a checkpoint is
        ``pending`` (the next call serves it from that one)."""
        request = self._read()
        if request is None or request.stop:
            return request is not None
        if committed is None or pending:
            return False
        with self.state.savepoint() as slot:
            if slot.serving is not None:  # a barrier took it meanwhile
                return False
            slot.serving = ServedSavepoint(request, committed.checkpoint_id)
        self.log(f"savepoint while idle: checkpoint {committed.checkpoint_id} is copied")
        self._serve(request, committed)
        return False

    def at_final(self, checkpoint_id: int) -> None:
        """The run's final checkpoint is triggered: it serves a stop request, or any request
        still pending."""
        with self.state.savepoint() as slot:
            if slot.serving is not None and slot.serving.checkpoint_id is None:
                slot.serving = dataclasses.replace(slot.serving, checkpoint_id=checkpoint_id)
            elif (request := self._pending(slot)) is not None:
                slot.serving = ServedSavepoint(request, checkpoint_id)

    def on_complete(self, manifest: CheckpointManifest) -> None:
        """Checkpoint ``manifest`` is complete and its output committed (the ack thread): if it
        serves the request, write the savepoint."""
        with self.state.savepoint() as slot:
            serving = slot.serving
            if serving is None or serving.checkpoint_id != manifest.checkpoint_id:
                return
        self._serve(serving.request, manifest)

    def _serve(self, request: SavepointRequest, manifest: CheckpointManifest) -> None:
        """Write ``request``'s savepoint of ``manifest`` (the slot serves it), record it, clear
        the request and free the slot."""
        location = savepoint_location(
            self.job, request, self.savepoint_root, manifest.checkpoint_id
        )
        try:
            info = self._left_by_earlier(request)
            if info is None:
                target_storage = open_storage(location)
                location = target_storage.url
                note_writing(self.storage, self.layout, request.request_id, location)
                info = write_savepoint(manifest, self.storage, target_storage)
            kill_point("savepoint-written")
        except (SavepointError, StorageError, ValueError) as e:
            reason = f"{type(e).__name__}: {e}"
            self.log(f"savepoint of checkpoint {manifest.checkpoint_id} failed: {reason}")
            row = savepoint_row(self.job, request, location, status="FAILED", reason=reason)
        else:
            row = completed_row(self.job, request, info)
            self.log(
                f"savepoint {info.location}: checkpoint {info.checkpoint_id} (batch "
                f"{info.batch_id}), {info.size:,} B in {info.file_count} files, copied in "
                f"{info.seconds:.1f} s"
            )
        try:
            self.catalog.record_savepoint(row)
            kill_point("savepoint-recorded")
            self.events.emit("savepoint", row)
            clear_request(self.storage, self.layout, request.request_id)
        finally:
            with self.state.savepoint() as slot:
                slot.serving = None

    def _left_by_earlier(self, request: SavepointRequest) -> SavepointInfo | None:
        """What an attempt that died writing a savepoint left: ``request``'s whole savepoint is
        returned, to be recorded (not written twice), unless ``request`` stops the job (its
        savepoint is the final checkpoint's); a partial or damaged one is deleted."""
        note = noted_writing(self.storage, self.layout)
        if note is None:
            return None
        noted, location = note
        started = time.perf_counter()
        target = open_storage(location)
        if not target.exists(SavepointLayout.METADATA):
            deleted = target.delete_many([f.path for f in target.list()])
            self.log(f"{location}: {deleted} files of a savepoint left unfinished deleted")
            return None
        if noted != request.request_id:
            self.log(f"{location}: a savepoint of request {noted}, since replaced, is left")
            return None
        if request.stop:  # the stop's savepoint is the final checkpoint's, past this one
            self.log(f"{location}: an earlier attempt's savepoint for this stop deleted")
            delete_savepoint(target)
            return None
        try:
            info = SavepointInfo.of(target, read_savepoint(target), started)
        except SavepointError as e:
            self.log(f"{e}: deleted; the savepoint is written again")
            delete_savepoint(target)
            return None
        self.log(f"{location}: written whole by an earlier attempt; checked, recorded now")
        return info

    def on_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` aborted: a request it served waits for the next
        barrier."""
        with self.state.savepoint() as slot:
            if slot.serving is not None and slot.serving.checkpoint_id == checkpoint_id:
                slot.serving = None


def check_savepoint(
    job: JobDefinition,
    location: str,
    *,
    allow_non_restored: bool = False,
    log: Callable[[str], None] = print,
) -> tuple[DurableStorage, CheckpointManifest]:
    """The savepoint at ``location`` (its storage and manifest) if ``job`` may start from it;
    raises naming the savepoint and its own job otherwise. Reads, and writes nothing: a start
    checks it before its attempt, its sinks or its JVM exist."""
    try:
        source = open_storage(location)
        saved = read_savepoint(source)
    except ValueError as e:  # SavepointError included: a missing or damaged file, named
        raise NoRestorableCheckpointError(str(e)) from None
    except AccessError as e:
        raise ConfigurationError(f"savepoint {location}: {e}") from None
    try:
        check_restorable(job, saved, allow_non_restored=allow_non_restored, log=log)
    except IncompatibleStateError as e:
        raise IncompatibleStateError(f"savepoint {location} (of {saved.job_id}): {e}") from None
    return source, saved


def start_from_savepoint(
    catalog: JobCatalog,
    storage: DurableStorage,
    job: JobDefinition,
    sinks: Sequence[SinkWriter],
    location: str,
    attempt: int,
    log: Callable[[str], None],
    *,
    allow_non_restored: bool = False,
    reset_sink: bool = False,
) -> CheckpointManifest:
    """Check the savepoint at ``location`` and import it as a new checkpoint of ``job``, taken
    by ``attempt``; returns that checkpoint's manifest.

    A savepoint of this job restores as an older checkpoint of it does: the epochs its sinks
    committed after it are replayed without output. A savepoint of another job, or one written
    from tables (``bootstrapped``), starts another history in this one: its sinks must hold no
    output (or ``reset_sink`` deletes it), its older checkpoints are retired, and its epochs
    continue above any its sinks committed.
    """
    started = time.monotonic()
    source, saved = check_savepoint(job, location, allow_non_restored=allow_non_restored, log=log)
    layout = JobLayout(job.name)
    continue_at = None
    if saved.job_id != job.name or saved.bootstrapped:
        begin_new_history(
            catalog,
            job.name,
            sinks,
            reset_sink,
            log,
            label=f"savepoint of {saved.job_id}",
            refusal=lambda table: (
                f"{location} is a savepoint of {saved.job_id}"
                + (" written from tables" if saved.bootstrapped else "")
                + f", and {job.name}'s sink table {table} has output of its own that the "
                "savepoint's history would continue: pass --reset-sink to delete it, or "
                "restore under another job name"
            ),
        )
        continue_at = max([saved.batch_id, *(s.committed_epoch() for s in sinks)])
    newest = catalog.newest_checkpoint_id(job.name)
    checkpoint_id, _ = claim_checkpoint_id(storage, layout, attempt, newest + 1)
    imported = import_savepoint(
        saved, source, storage, job.name, checkpoint_id, attempt, batch_id=continue_at
    )
    kill_point("savepoint-imported")
    catalog.commit_checkpoint(CompletedCheckpoint.from_manifest(imported, now_ms()))
    catalog.record_shared_files(shared_file_rows(imported, set()))
    log(
        f"savepoint {location} (checkpoint {saved.checkpoint_id} of {saved.job_id}, batch "
        f"{saved.batch_id}) imported as checkpoint {checkpoint_id} of {job.name}: "
        f"{imported.file_count} files, {imported.full_size:,} B, checked and copied in "
        f"{time.monotonic() - started:.1f} s"
    )
    return imported
