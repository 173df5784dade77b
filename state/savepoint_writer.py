"""Savepoints written from tables (state/state_writer.py): a new one, or a changed copy of an
existing checkpoint or savepoint.

Each subtask of each stage written gets a database: the base's state of that subtask (restored
from its files, checksums verified) or an empty one, in which every state written is replaced
by its table's entries in the subtask's key groups; it is snapshotted and uploaded into the
savepoint directory as a checkpoint's snapshot would be. The stages not written keep the base's
files, copied as they are. The manifest goes last: from a base, its positions, sink epochs,
watermarks and clocks, so a job restoring it continues the base's history; new, the positions
given and ``bootstrapped`` set, so the job that restores it starts another history there.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

from state.keygroups import key_group_range
from state.manifest import CheckpointManifest, Positions
from state.paths import JobLayout, SavepointLayout
from state.restore import restore_subtask
from state.rocksdb_store import RocksDBStore
from state.savepoint import SavepointInfo, check_free, copy_files
from state.snapshot import upload_snapshot
from state.state_timers import EncodedTimers, replace_timers
from state.state_writer import EncodedState, replace_states
from state.storage import DurableStorage

NEW_CHECKPOINT_ID = 1


def write_states_savepoint(
    writes: dict[str, list[EncodedState | EncodedTimers]],
    target: DurableStorage,
    *,
    job_id: str,
    stages: dict[str, dict[str, str]],
    parallelism: int,
    max_parallelism: int,
    base: tuple[CheckpointManifest, DurableStorage, JobLayout] | None = None,
    positions: Positions | None = None,
) -> SavepointInfo:
    """Write a savepoint into ``target`` holding, per stage uid in ``writes``, its states (and
    its timers, when given) replaced by the encoded tables; ``stages``: every stage's state
    fingerprints (recorded for the restore's check). ``base``: the manifest, storage and
    layout of the checkpoint or savepoint whose other state it keeps (its parallelism then, not
    ``parallelism``)."""
    started = time.perf_counter()
    check_free(target)
    manifest, source, layout = base if base is not None else (None, None, None)
    checkpoint_id = manifest.checkpoint_id if manifest else NEW_CHECKPOINT_ID
    if manifest is not None:
        held = [h.subtask for h in manifest.subtasks]
        parallelism = max(held) + 1 if held else parallelism
    handles = []
    with tempfile.TemporaryDirectory(prefix="cutline-state-write-") as scratch:
        for uid, states in writes.items():
            for subtask in range(parallelism):
                kgs = key_group_range(subtask, parallelism, max_parallelism)
                db = Path(scratch) / f"{uid}-{subtask}"
                snapshot = Path(scratch) / f"{uid}-{subtask}.snapshot"
                old = manifest.handle(uid, subtask) if manifest else None
                if old is not None:
                    restore_subtask(old, source, layout, db)
                with RocksDBStore(db, kgs) as store:
                    replace_states(store, [w for w in states if isinstance(w, EncodedState)])
                    for timers in (w for w in states if isinstance(w, EncodedTimers)):
                        replace_timers(store, timers)
                    store.snapshot_to(snapshot)
                handles.append(
                    upload_snapshot(
                        target, SavepointLayout(), uid, subtask, checkpoint_id, snapshot, kgs
                    )
                )
    kept = [h for h in manifest.subtasks if h.operator not in writes] if manifest else []
    if kept:
        files = [f for h in kept for f in h.files]
        copy_files(
            [(layout.job_path(f.path), f.path, f.stored_size) for f in files], source, target
        )
    if manifest is not None:
        written = dataclasses.replace(
            manifest,
            subtasks=tuple(sorted([*kept, *handles], key=lambda h: (h.operator, h.subtask))),
            stages={**manifest.stages, **{uid: stages[uid] for uid in writes}},
            savepoint=True,
        )
    else:
        written = CheckpointManifest(
            job_id=job_id,
            checkpoint_id=checkpoint_id,
            batch_id=0,
            attempt=0,
            trigger_time_ms=int(time.time() * 1000),
            source_positions={
                src: {str(p): int(o) for p, o in parts.items()}
                for src, parts in (positions or {}).items()
            },
            subtasks=tuple(handles),
            stages=stages,
            savepoint=True,
            bootstrapped=True,
        )
    target.put_bytes(SavepointLayout.METADATA, written.to_json())
    return SavepointInfo.of(target, written, started)
