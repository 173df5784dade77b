"""Local secondary copies of one subtask's snapshots (Flink's task-local recovery).

Directory layout, one per subtask under the local state root::

    <local_state_root>/<job>/<operator>/<subtask>/db-a<attempt>/  working RocksDB of an attempt
    <local_state_root>/<job>/<operator>/<subtask>/chk-<n>/        snapshot n (hard links)
    <local_state_root>/<job>/<operator>/<subtask>/chk-<n>/_handle.json
    <local_state_root>/<job>/<operator>/<subtask>/_verified.json    checksums read, by file identity

Every attempt works in a database of its own, so an older attempt that still runs (a zombie) never
touches the working state of a newer one; snapshot directories are named by checkpoint id, which
no two attempts share (state/coordinator.py claims them). A ``chk-<n>`` directory is a usable
local copy only once its ``_handle.json`` (the handle the primary copy was acknowledged with) is
written. Keeping a local copy is best effort: a failure to write it is logged and the copy
dropped, never failing the checkpoint.

A restore verifies a local file against the handle's checksum. Reading every byte of a large
state for that (0.7 s a subtask at 1 GiB) is avoided for files whose bytes this host already
read: ``_verified.json`` maps a file's identity (inode, size, modification time in ns) to the
checksum computed when its bytes were last read, by the upload that made it primary or by a
restore, if the file had not been written for ``SETTLED_S`` before. Every later write through
the file system changes the identity; what could change bytes without it (a failing disk, a
reset time) is caught by RocksDB's block checksums when the blocks are read, and then
:meth:`LocalCopies.distrust` drops the map, so the next restore reads every local file again
and takes the primary copy of the corrupt one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from state.handles import SubtaskStateHandle
from state.paths import JobLayout

log = logging.getLogger(__name__)

HANDLE_FILE = "_handle.json"
VERIFIED_FILE = "_verified.json"
# file systems stamp modification times from a coarse clock (a kernel tick; FAT in steps of 2 s)
SETTLED_S = 2.0


def file_identity(path: str | Path) -> str:
    """What changes whenever a file's bytes are written through the file system: its inode,
    size and modification time (ns)."""
    return _identity(os.stat(path))


def settled_identity(path: str | Path) -> str | None:
    """:func:`file_identity` taken before reading a file, if its last write was at least
    ``SETTLED_S`` ago (else None): any write after this moment then stamps a later time, so a
    file with this identity still holds the bytes read next."""
    st = os.stat(path)
    return _identity(st) if time.time_ns() - st.st_mtime_ns >= SETTLED_S * 1e9 else None


def _identity(st: os.stat_result) -> str:
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


class LocalCopies:
    """The working database and the local snapshot directories of one subtask."""

    def __init__(
        self,
        local_state_root: str | Path,
        job_id: str,
        operator: str,
        subtask: int,
        attempt: int = 0,
    ):
        layout = JobLayout(job_id)
        self.root = Path(local_state_root) / layout.job_id / operator / str(int(subtask))
        self.attempt = attempt

    @property
    def db_dir(self) -> Path:
        """This attempt's working database."""
        return self.root / f"db-a{self.attempt}"

    def drop_older_working_dirs(self) -> list[int]:
        """Delete the working databases of older attempts, and what their restores left (never a
        newer one's). Returns their attempt numbers."""
        if not self.root.is_dir():
            return []
        dropped = set()
        for directory in self.root.glob("db-a*"):
            attempt = _working_attempt(directory.name)
            if attempt is not None and attempt < self.attempt:
                shutil.rmtree(directory, ignore_errors=True)
                dropped.add(attempt)
        return sorted(dropped)

    def drop_beyond(self, parallelism: int, confirmed: int) -> list[int]:
        """After a scale-in: on this host, delete what older attempts left for the operator's
        subtasks at or above ``parallelism`` (which this attempt does not run): their working
        databases, and their snapshots older than checkpoint ``confirmed`` (the latest completed;
        the restored one at first), which no restore of it or a later one reads. A newer
        attempt's working database (a later scale-out's) is never touched, nor its snapshots,
        which are newer than any this attempt confirms. Returns the subtasks something was
        deleted of."""
        operator = self.root.parent
        dropped = set()
        for directory in operator.iterdir() if operator.is_dir() else ():
            if not directory.name.isdigit() or int(directory.name) < parallelism:
                continue
            for entry in list(directory.iterdir()):
                attempt = _working_attempt(entry.name)
                cid = JobLayout.checkpoint_id_of(entry.name)
                if (attempt is not None and attempt < self.attempt) or (
                    cid is not None and cid < confirmed
                ):
                    shutil.rmtree(entry, ignore_errors=True)
                    dropped.add(int(directory.name))
        return sorted(dropped)

    def snapshot_dir(self, checkpoint_id: int) -> Path:
        return self.root / JobLayout.checkpoint_dir(checkpoint_id)

    def checkpoint_ids(self) -> list[int]:
        """Ids of all snapshot directories present (retained or not), ascending."""
        if not self.root.is_dir():
            return []
        ids = (JobLayout.checkpoint_id_of(p.name) for p in self.root.iterdir())
        return sorted(i for i in ids if i is not None)

    def retain(self, handle: SubtaskStateHandle) -> bool:
        """Mark snapshot ``handle.checkpoint_id`` as this subtask's local copy of ``handle``.

        Returns False (and drops the directory) if the copy could not be recorded.
        """
        directory = self.snapshot_dir(handle.checkpoint_id)
        try:
            self._write_handle(directory, handle)
            return True
        except OSError as e:
            log.warning("local copy of checkpoint %s dropped: %s", handle.checkpoint_id, e)
            self.discard(handle.checkpoint_id)
            return False

    @staticmethod
    def _write_handle(directory: Path, handle: SubtaskStateHandle) -> None:
        tmp = directory / f".{HANDLE_FILE}.tmp"
        tmp.write_text(json.dumps(handle.to_dict()))
        os.replace(tmp, directory / HANDLE_FILE)

    def find(self, checkpoint_id: int) -> tuple[Path, SubtaskStateHandle] | None:
        """The local copy of checkpoint ``checkpoint_id`` and its recorded handle, if any."""
        directory = self.snapshot_dir(checkpoint_id)
        try:
            doc = json.loads((directory / HANDLE_FILE).read_text())
            return directory, SubtaskStateHandle.from_dict(doc)
        except (OSError, ValueError, KeyError, TypeError) as e:
            if directory.exists():
                log.info(
                    "no usable local copy of checkpoint %s in %s: %s", checkpoint_id, directory, e
                )
            return None

    def verified(self) -> dict[str, str]:
        """File identity -> the checksum its bytes had when this host last read them."""
        try:
            doc = json.loads((self.root / VERIFIED_FILE).read_text())
            return {str(k): str(v) for k, v in doc.items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def record_verified(self, checksums: dict[str, str]) -> None:
        """Remember checksums computed from files' bytes, by the identity each file had before
        the read (:func:`settled_identity`), keeping only the identities of files still in a
        local copy or a working database. Best effort: a failure only means the next restore
        reads the files again."""
        if not checksums:
            return
        try:
            known = self.verified()
            known.update(checksums)
            live = set()
            for directory in self.root.iterdir():
                # a snapshot dropped or a compaction's input deleted meanwhile: not live
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    for path in directory.iterdir():
                        with contextlib.suppress(FileNotFoundError):
                            live.add(file_identity(path))
            # uploads of two checkpoints may record at once: each writes a file of its own
            tmp = self.root / f".{VERIFIED_FILE}.{os.getpid()}.{threading.get_ident()}"
            tmp.write_text(json.dumps({k: v for k, v in known.items() if k in live}))
            os.replace(tmp, self.root / VERIFIED_FILE)
        except OSError as e:
            log.info("checksums of local copies not recorded in %s: %s", self.root, e)

    def distrust(self) -> None:
        """Forget every recorded checksum: the next restore reads each local file again. For
        when RocksDB found a block whose checksum does not match."""
        with contextlib.suppress(FileNotFoundError):
            (self.root / VERIFIED_FILE).unlink()

    def discard(self, checkpoint_id: int) -> None:
        shutil.rmtree(self.snapshot_dir(checkpoint_id), ignore_errors=True)

    def confirm(self, checkpoint_id: int) -> list[int]:
        """Checkpoint ``checkpoint_id`` completed: drop every older snapshot directory.

        Newer ones belong to pending checkpoints and stay. Returns the ids dropped.
        """
        dropped = [i for i in self.checkpoint_ids() if i < checkpoint_id]
        for i in dropped:
            self.discard(i)
        return dropped


def _working_attempt(name: str) -> int | None:
    """The attempt of a working database directory: ``db-a<n>``, or what a restore of attempt
    ``n`` left (``db-a<n>.restoring``, ``db-a<n>.rescaling``, ``db-a<n>.from-<i>``)."""
    suffix = name[len("db-a") :].split(".", 1)[0] if name.startswith("db-a") else ""
    return int(suffix) if suffix.isdigit() else None
