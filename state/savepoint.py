"""Savepoints: self-contained, relocatable copies of a completed checkpoint.

A savepoint directory (a local path or an ``s3://`` URL) holds ``_metadata``, the checkpoint's
manifest with ``savepoint`` set, and its own copy of every file the manifest names, at the
same relative paths (``shared/<stage>/<subtask>/...``, ``chk-<n>/...``). Nothing it needs lies
outside it, so it can be copied to another bucket or prefix and restored from there, and no
job's GC ever touches it: it is outside every job's directory and no catalog refcount counts
it. ``_metadata`` is written last and deleted first: a directory without it is no savepoint.

A restore imports it (:func:`import_savepoint`): its files are copied into the restoring job's
directory under fresh names, as a new checkpoint of that job. From then on it is that job's
own checkpoint (GC, local copies, fallbacks and the restore drill apply to it, and an attempt
that fails before its first checkpoint restores it again), and the savepoint stays untouched.
Copies between locations of one storage service happen inside it (S3 CopyObject).

A running job takes one at a barrier when asked (:class:`SavepointRequest`, stored beside its
checkpoints like a compaction request; spark_jobs/driver/savepoints.py serves it).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from state.compaction import REQUESTS_DIR
from state.errors import BadInputError
from state.faults import kill_point
from state.handles import SubtaskStateHandle
from state.manifest import CheckpointManifest, ManifestError
from state.paths import JobLayout, SavepointLayout
from state.restore import validate_checkpoint
from state.storage import DurableStorage, MissingFileError

SAVEPOINT_REQUEST = f"{REQUESTS_DIR}/savepoint.json"
SAVEPOINT_WRITING = f"{REQUESTS_DIR}/savepoint-writing.json"  # where the request's copy goes
COPY_THREADS = 8


class SavepointError(BadInputError):
    """A savepoint cannot be written, read or restored; the message names the location and the
    file."""


@dataclass(frozen=True)
class SavepointInfo:
    """A savepoint written: where, of which checkpoint, its size and how long the copy took."""

    location: str
    job_id: str
    checkpoint_id: int
    batch_id: int
    size: int
    file_count: int
    seconds: float

    @classmethod
    def of(
        cls, target: DurableStorage, manifest: CheckpointManifest, started: float
    ) -> SavepointInfo:
        """The savepoint of ``manifest`` written to ``target``, begun at ``started``
        (``time.perf_counter``)."""
        return cls(
            target.url,
            manifest.job_id,
            manifest.checkpoint_id,
            manifest.batch_id,
            manifest.full_size,
            manifest.file_count,
            time.perf_counter() - started,
        )


def check_free(target: DurableStorage) -> None:
    """Refuse a directory that already holds a savepoint: one is never overwritten."""
    if target.exists(SavepointLayout.METADATA):
        raise SavepointError(f"{target.url} already holds a savepoint: choose another target")


def copy_files(
    pairs: list[tuple[str, str, int]],
    source: DurableStorage,
    target: DurableStorage,
    point: str = "savepoint-copying",
) -> None:
    """Copy ``(source path, target path, size)`` pairs from ``source`` to ``target``, several
    at a time (each inside the storage service where it can); ``point``: the kill point each
    file copied reaches (state/faults.py)."""

    def copy(pair: tuple[str, str, int]) -> None:
        source.copy_to(pair[0], target, pair[1], expected_size=pair[2])
        kill_point(point)

    with ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="cutline-copy") as pool:
        list(pool.map(copy, pairs))


def write_savepoint(
    manifest: CheckpointManifest, storage: DurableStorage, target: DurableStorage
) -> SavepointInfo:
    """Copy checkpoint ``manifest`` (its files in ``storage`` under its job's directory) into
    the savepoint directory ``target``; ``_metadata`` last. Refuses a directory that already
    holds a savepoint."""
    started = time.perf_counter()
    check_free(target)
    layout = JobLayout(manifest.job_id)
    files = [(layout.job_path(f.path), f.path, f.stored_size) for f in manifest.files()]
    copy_files(files, storage, target)
    target.put_bytes(
        SavepointLayout.METADATA, dataclasses.replace(manifest, savepoint=True).to_json()
    )
    return SavepointInfo.of(target, manifest, started)


def read_savepoint(target: DurableStorage, *, checksums: bool = True) -> CheckpointManifest:
    """The manifest of the savepoint in ``target``, after checking that every file it names is
    there with its size (and, with ``checksums``, its contents: every byte is read).
    :class:`SavepointError` names what is missing or wrong."""
    try:
        data = target.get_bytes(SavepointLayout.METADATA)
    except MissingFileError:
        raise SavepointError(
            f"no savepoint at {target.url}: it has no {SavepointLayout.METADATA}"
        ) from None
    try:
        manifest = CheckpointManifest.from_json(data, source=f"{target.url}/_metadata")
    except ManifestError as e:
        raise SavepointError(f"savepoint {target.url}: {e}") from e
    if not manifest.savepoint:
        raise SavepointError(
            f"{target.url} holds a checkpoint's manifest, not a savepoint's: restore a "
            "checkpoint by its id (cutline run JOB --restore ID)"
        )
    problems = validate_checkpoint(manifest, target, checksums=checksums, layout=SavepointLayout())
    if problems:
        raise SavepointError(
            f"savepoint {target.url} cannot be restored: {'; '.join(problems[:5])}"
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
        )
    return manifest


def imported_paths(manifest: CheckpointManifest, checkpoint_id: int) -> dict[str, str]:
    """Where each file of savepoint ``manifest`` goes when it becomes checkpoint
    ``checkpoint_id`` of a job: fresh names (one token for the import, as one snapshot's
    uploads share one), so they never meet a file the job already has."""
    token = uuid.uuid4().hex[:16]
    out: dict[str, str] = {}
    for h in manifest.subtasks:
        for f in h.files:
            if f.shared:
                stem = f.local_name.removesuffix(".sst")
                out[f.path] = JobLayout.shared_file(h.operator, h.subtask, f"{stem}-{token}.sst")
            else:
                name = f"{f.local_name}.{token}"
                out[f.path] = JobLayout.private_file(checkpoint_id, h.operator, h.subtask, name)
    return out


def import_savepoint(
    manifest: CheckpointManifest,
    source: DurableStorage,
    storage: DurableStorage,
    job_id: str,
    checkpoint_id: int,
    attempt: int,
    *,
    batch_id: int | None = None,
) -> CheckpointManifest:
    """Copy savepoint ``manifest`` (in ``source``) into job ``job_id``'s directory in
    ``storage`` as its checkpoint ``checkpoint_id`` (claimed by ``attempt`` beforehand), and
    write that checkpoint's manifest; returns it. It is a checkpoint of the job taken by
    ``attempt``: it is no savepoint, and its sinks' staged output is ``attempt``'s (none).
    ``batch_id``: the epoch its state stands at in the job, if not the savepoint's (another
    job's sinks count epochs of their own); its sinks then hold every epoch up to it, the
    last ending at the savepoint's cut."""
    layout = JobLayout(job_id)
    moved = imported_paths(manifest, checkpoint_id)
    copy_files(
        [(f.path, layout.job_path(moved[f.path]), f.stored_size) for f in manifest.files()],
        source,
        storage,
        point="savepoint-importing",
    )

    def relocated(h: SubtaskStateHandle) -> SubtaskStateHandle:
        files = tuple(dataclasses.replace(f, path=moved[f.path]) for f in h.files)
        uploaded = sum(f.stored_size for f in files)
        return dataclasses.replace(
            h, checkpoint_id=checkpoint_id, files=files, uploaded_bytes=uploaded
        )

    if batch_id is not None:  # the sinks' first commit records where that epoch ended
        ends = {batch_id: manifest.source_positions}
        manifest = dataclasses.replace(
            manifest, batch_id=batch_id, sink_epochs={}, epoch_ends=ends, epoch_times={}
        )
    imported = dataclasses.replace(
        manifest,
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        attempt=attempt,
        savepoint=False,
        subtasks=tuple(relocated(h) for h in manifest.subtasks),
    )
    storage.put_bytes(layout.job_path(layout.metadata(checkpoint_id)), imported.to_json())
    return imported


def delete_savepoint(target: DurableStorage) -> int:
    """Delete the savepoint in ``target``: ``_metadata`` first (what is left is no savepoint),
    then every file under the directory. Returns the files deleted."""
    if not target.exists(SavepointLayout.METADATA):
        raise SavepointError(f"no savepoint at {target.url}: it has no _metadata")
    target.delete(SavepointLayout.METADATA)
    return 1 + target.delete_many([info.path for info in target.list()])


# -- requests ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SavepointRequest:
    """Take a savepoint into ``target`` (a directory URL; empty: the deployment's savepoint
    root) at the next barrier; with ``stop``, stop the job there (its final checkpoint is the
    savepoint, its output all committed)."""

    request_id: str
    target: str
    stop: bool
    requested_at_ms: int

    @classmethod
    def new(cls, target: str, stop: bool, now_ms: int) -> SavepointRequest:
        return cls(uuid.uuid4().hex[:12], target, stop, now_ms)

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, *, source: str = SAVEPOINT_REQUEST) -> SavepointRequest:
        try:
            doc = json.loads(data)
            stop = doc["stop"]
            if not isinstance(stop, bool):
                raise ValueError(f"stop must be true or false, got {stop!r}")
            return cls(
                str(doc["request_id"]), str(doc["target"]), stop, int(doc["requested_at_ms"])
            )
        except (ValueError, KeyError, TypeError) as e:
            raise SavepointError(f"{source}: not a valid savepoint request ({e})") from e


def write_request(storage: DurableStorage, layout: JobLayout, request: SavepointRequest) -> None:
    """Store ``request`` for the job's running attempt (replacing one not yet served)."""
    storage.put_bytes(layout.job_path(SAVEPOINT_REQUEST), request.to_json())


def read_request(storage: DurableStorage, layout: JobLayout) -> SavepointRequest | None:
    """The pending request, or None; a malformed one raises :class:`SavepointError`."""
    path = layout.job_path(SAVEPOINT_REQUEST)
    try:
        return SavepointRequest.from_json(storage.get_bytes(path), source=path)
    except MissingFileError:
        return None


def clear_request(storage: DurableStorage, layout: JobLayout, request_id: str) -> None:
    """Delete the pending request if it is request ``request_id`` (a newer one stays), and
    the note of where its savepoint was being written."""
    current = read_request(storage, layout)
    if current is not None and current.request_id == request_id:
        storage.delete(layout.job_path(SAVEPOINT_REQUEST))
    storage.delete(layout.job_path(SAVEPOINT_WRITING))


def note_writing(storage: DurableStorage, layout: JobLayout, request_id: str, url: str) -> None:
    """Note, before a copy begins, that request ``request_id``'s savepoint is written at
    ``url``: an attempt that dies mid-copy leaves a directory the next one finds."""
    doc = {"request_id": request_id, "location": url}
    storage.put_bytes(layout.job_path(SAVEPOINT_WRITING), json.dumps(doc).encode())


def noted_writing(storage: DurableStorage, layout: JobLayout) -> tuple[str, str] | None:
    """``(request id, location)`` of the savepoint an earlier attempt began writing and did
    not record, if one did."""
    try:
        doc = json.loads(storage.get_bytes(layout.job_path(SAVEPOINT_WRITING)))
    except MissingFileError:
        return None
    return str(doc["request_id"]), str(doc["location"])
