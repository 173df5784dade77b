"""Snapshots of one subtask: a short synchronous part and an asynchronous upload.

Synchronous part (on the caller's thread, at the barrier): flush the memtable and create a RocksDB
checkpoint of hard links in the subtask's local snapshot directory. Processing goes on right after.

Asynchronous part (on an executor thread): upload what the *base* handle (the subtask's handle in
the last confirmed checkpoint) does not already hold, re-reference the rest, and produce the new
:class:`SubtaskStateHandle`. SST files are immutable, so they go once to ``shared/`` under a unique
name; every other file (MANIFEST, OPTIONS, CURRENT, ...) is private to the checkpoint. A failed
upload raises through the future (the checkpoint is declined); the previous checkpoint is untouched
because nothing it references is ever overwritten.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import uuid
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path

from state.backend import KeyedStateBackend
from state.file_codec import DEFAULT_CODEC, NONE, encode_file
from state.handles import StateFile, SubtaskStateHandle
from state.keygroups import KeyGroupRange
from state.local_copies import HANDLE_FILE, LocalCopies, settled_identity
from state.paths import JobLayout
from state.storage import DurableStorage

_executor: ThreadPoolExecutor | None = None


def default_executor() -> ThreadPoolExecutor:
    """The process-wide pool that runs asynchronous snapshot parts."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="cutline-snapshot")
    return _executor


def upload_snapshot(
    storage: DurableStorage,
    layout: JobLayout,
    operator: str,
    subtask: int,
    checkpoint_id: int,
    directory: Path,
    key_group_range: KeyGroupRange,
    base: SubtaskStateHandle | None = None,
    incremental: bool = True,
    read: dict[str, str] | None = None,
    codec: str = DEFAULT_CODEC,
) -> SubtaskStateHandle:
    """Upload snapshot ``directory`` and return its handle (timings left at zero). ``read``
    collects the checksums of the files it read, by their settled identity
    (state/local_copies.py). Each file is stored encoded with ``codec`` (state/file_codec.py).

    With ``incremental``, an SST file whose name and size match a file of ``base`` is re-referenced
    instead of uploaded. ``base`` must come from the last *confirmed* checkpoint; a base of
    another key-group range (the subtask was rescaled since) shares nothing: its files hold other
    keys, whatever their names.
    """
    same_keys = base is not None and base.key_group_range == key_group_range
    reusable = (
        {f.local_name: f for f in base.files if f.shared} if same_keys and incremental else {}
    )
    # Remote names are unique per snapshot, so two attempts that reach the same checkpoint id
    # (a zombie and its successor) never overwrite each other's files.
    token = uuid.uuid4().hex[:16]
    files: list[StateFile] = []
    uploaded = 0
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if not entry.is_file() or entry.name.startswith(".") or entry.name == HANDLE_FILE:
            continue
        size = entry.stat().st_size
        previous = reusable.get(entry.name)
        if previous is not None and previous.size == size:
            files.append(previous)
            continue
        if incremental and entry.name.endswith(".sst"):
            stem = entry.name[: -len(".sst")]
            path = layout.shared_file(operator, subtask, f"{stem}-{token}.sst")
        else:
            path = layout.private_file(checkpoint_id, operator, subtask, f"{entry.name}.{token}")
        settled = settled_identity(entry.path) if read is not None else None
        # an encoded copy is written beside the file, on the executor's local disk (a hidden
        # name the scan skips; a crash leaves it in a directory no restore reads and the next
        # confirm or snapshot of this id deletes)
        source = Path(entry.path)
        stored_from = source if codec == NONE else directory / f".{entry.name}.{codec}"
        try:
            checksum = encode_file(source, stored_from, codec)
            stored = storage.put_file(stored_from, layout.job_path(path))
        finally:
            if stored_from != source:
                stored_from.unlink(missing_ok=True)
        if settled is not None:
            read[settled] = checksum
        uploaded += stored
        kept = stored if codec != NONE else None
        files.append(StateFile(entry.name, path, size, checksum, codec, kept))
    return SubtaskStateHandle(
        operator=operator,
        subtask=subtask,
        key_group_range=key_group_range,
        checkpoint_id=checkpoint_id,
        files=tuple(files),
        uploaded_bytes=uploaded,
    )


class SubtaskSnapshotter:
    """Takes snapshots of one subtask's state store."""

    def __init__(
        self,
        storage: DurableStorage,
        copies: LocalCopies,
        job_id: str,
        operator: str,
        subtask: int,
        *,
        incremental: bool = True,
        local_recovery: bool = True,
        codec: str = DEFAULT_CODEC,
        executor: Executor | None = None,
    ) -> None:
        self.storage = storage
        self.copies = copies
        self.layout = JobLayout(job_id)
        self.operator = operator
        self.subtask = subtask
        self.incremental = incremental
        self.local_recovery = local_recovery
        self.codec = codec
        self.executor = executor or default_executor()

    def snapshot(
        self,
        store: KeyedStateBackend,
        checkpoint_id: int,
        base: SubtaskStateHandle | None,
    ) -> Future[SubtaskStateHandle]:
        """Run the synchronous part now; return a future of the acknowledged handle.

        The future fails if the upload fails; the store may be closed once this returns.
        """
        started = time.perf_counter()
        directory = self.copies.snapshot_dir(checkpoint_id)
        if directory.exists():  # left by an attempt that died before completing this id
            shutil.rmtree(directory)
        store.snapshot_to(directory)
        sync_ms = (time.perf_counter() - started) * 1000
        return self.executor.submit(
            self._async_part, checkpoint_id, directory, store.key_group_range, base, sync_ms
        )

    def _async_part(
        self,
        checkpoint_id: int,
        directory: Path,
        key_group_range: KeyGroupRange,
        base: SubtaskStateHandle | None,
        sync_ms: float,
    ) -> SubtaskStateHandle:
        started = time.perf_counter()
        read: dict[str, str] = {}
        try:
            handle = upload_snapshot(
                self.storage,
                self.layout,
                self.operator,
                self.subtask,
                checkpoint_id,
                directory,
                key_group_range,
                base,
                self.incremental,
                read,
                self.codec,
            )
        except BaseException:
            self.copies.discard(checkpoint_id)
            raise
        handle = dataclasses.replace(
            handle,
            sync_ms=round(sync_ms, 3),
            async_ms=round((time.perf_counter() - started) * 1000, 3),
        )
        if not (self.local_recovery and self.copies.retain(handle)):
            self.copies.discard(checkpoint_id)
            return handle
        self.copies.record_verified(read)  # a restore from this copy need not read them again
        return handle
