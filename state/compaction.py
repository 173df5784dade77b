"""State compaction: when a subtask's checkpointed state has become a long chain of files, and
the request that asks a running job to compact it at its next barrier.

An incremental checkpoint re-references the SST files of earlier ones, so the files a restore
must read can come from many checkpoints. A full RocksDB compaction rewrites them into few files;
the next checkpoint uploads those and references nothing older. The request lives in primary
storage next to the job's checkpoints (``<job>/_requests/compact.json``), where the driver of
a running attempt reads it when it triggers a checkpoint, and deletes it once a checkpoint taken
after the compaction has completed. A request survives a driver crash: the restored attempt
serves it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from state.errors import BadInputError
from state.handles import SubtaskStateHandle
from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.storage import DurableStorage, MissingFileError

REQUESTS_DIR = "_requests"  # control files for a running job: never GC's to touch
COMPACT_REQUEST = f"{REQUESTS_DIR}/compact.json"


class CompactionRequestError(BadInputError):
    """A compaction request file is malformed; the message says what is wrong."""


def source_checkpoints(handle: SubtaskStateHandle) -> int:
    """How many checkpoints uploaded the shared files ``handle`` references.

    Every snapshot names its uploads with one unique token (``<sst>-<token>.sst``), so the
    distinct tokens are the distinct uploading checkpoints.
    """
    tokens = {f.path.rsplit("-", 1)[-1] for f in handle.files if f.shared}
    return len(tokens)


def subtasks_to_compact(
    manifest: CheckpointManifest, *, max_files: int, max_checkpoints: int
) -> dict[int, str]:
    """Subtasks of ``manifest`` whose state references more than ``max_files`` files, or files
    from more than ``max_checkpoints`` checkpoints, each with the reason."""
    out: dict[int, str] = {}
    for h in manifest.subtasks:
        files, sources = len(h.files), source_checkpoints(h)
        reasons = []
        if files > max_files:
            reasons.append(f"{files} files > {max_files}")
        if sources > max_checkpoints:
            reasons.append(f"files from {sources} checkpoints > {max_checkpoints}")
        if reasons:
            out[h.subtask] = "; ".join(reasons)
    return out


@dataclass(frozen=True)
class CompactionRequest:
    """Compact these subtasks' RocksDB before the next checkpoint's snapshot."""

    subtasks: tuple[int, ...]
    requested_at_ms: int
    based_on: int | None  # the checkpoint whose chain was measured
    reason: str

    def to_json(self) -> bytes:
        doc = {
            "subtasks": list(self.subtasks),
            "requested_at_ms": self.requested_at_ms,
            "based_on": self.based_on,
            "reason": self.reason,
        }
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, *, source: str = COMPACT_REQUEST) -> CompactionRequest:
        try:
            doc = json.loads(data)
            subtasks = doc["subtasks"]
            if not isinstance(subtasks, list) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in subtasks
            ):
                raise ValueError(f"subtasks must be a list of subtask numbers, got {subtasks!r}")
            based_on = doc.get("based_on")
            return cls(
                subtasks=tuple(sorted(set(subtasks))),
                requested_at_ms=int(doc["requested_at_ms"]),
                based_on=None if based_on is None else int(based_on),
                reason=str(doc.get("reason", "")),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CompactionRequestError(f"{source}: not a valid compaction request ({e})") from e


def write_request(storage: DurableStorage, layout: JobLayout, request: CompactionRequest) -> str:
    """Store ``request`` (replacing any earlier one) and return its storage path."""
    path = layout.job_path(COMPACT_REQUEST)
    storage.put_bytes(path, request.to_json())
    return path


def read_request(storage: DurableStorage, layout: JobLayout) -> CompactionRequest | None:
    """The pending request, or None. A malformed one raises :class:`CompactionRequestError`."""
    path = layout.job_path(COMPACT_REQUEST)
    try:
        data = storage.get_bytes(path)
    except MissingFileError:
        return None
    return CompactionRequest.from_json(data, source=path)


def clear_request(storage: DurableStorage, layout: JobLayout, served: CompactionRequest) -> bool:
    """Delete the request if it is still ``served`` (a newer one stays for the next barrier).
    Returns whether it was deleted."""
    try:
        current = read_request(storage, layout)
    except CompactionRequestError:
        current = served  # malformed: nothing can serve it
    if current != served:
        return False
    return storage.delete(layout.job_path(COMPACT_REQUEST))
