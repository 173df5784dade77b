"""Local secondary copies of one subtask's snapshots (Flink's task-local recovery).

Directory layout, one per subtask under the local state root::

    <local_state_root>/<job>/<operator>/<subtask>/db-a<attempt>/  working RocksDB of an attempt
    <local_state_root>/<job>/<operator>/<subtask>/chk-<n>/        snapshot n (hard links)
    <local_state_root>/<job>/<operator>/<subtask>/chk-<n>/_handle.json

Every attempt works in a database of its own, so an older attempt that still runs (a zombie) never
touches the working state of a newer one; snapshot directories are named by checkpoint id, which
no two attempts share (state/coordinator.py claims them). A ``chk-<n>`` directory is a usable
local copy only once its ``_handle.json`` (the handle the primary copy was acknowledged with) is
written. Keeping a local copy is best effort: a failure to write it is logged and the copy
dropped, never failing the checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from state.handles import SubtaskStateHandle
from state.paths import JobLayout

log = logging.getLogger(__name__)

HANDLE_FILE = "_handle.json"


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
