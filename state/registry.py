"""The shared state registry and the retention rules, as pure functions over manifests.

Rules (docs/design.md §9, learned from Flink's own bugs):

* a file's refcount is the number of retained checkpoints whose manifest references it, always
  recomputed from the manifests, never incremented and decremented, so it cannot drift;
* a file referenced by a retained checkpoint, a pending checkpoint or the checkpoint the job was
  restored from is never deletable;
* a file no manifest references is deletable only once it is older than the grace period, which
  protects uploads of pending checkpoints that have no manifest yet;
* the latest completed checkpoint is never subsumed, and savepoints are never subsumed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from state.manifest import CheckpointManifest
from state.paths import JobLayout


@dataclass(frozen=True)
class StoredFile:
    """A file under a job's root in durable storage; ``path`` is relative to the job root."""

    path: str
    size: int
    modified: float


def refcounts(retained: Iterable[CheckpointManifest]) -> dict[str, int]:
    """Shared path -> number of retained checkpoints that reference it."""
    counts: Counter[str] = Counter()
    for m in retained:
        counts.update(m.shared_paths())
    return dict(counts)


def select_subsumed(completed: Iterable[tuple[int, bool]], num_retained: int) -> list[int]:
    """Ids to subsume among completed ``(checkpoint_id, is_savepoint)`` pairs.

    Keeps the ``num_retained`` newest non-savepoint checkpoints (at least the latest one).
    """
    regular = sorted(cid for cid, savepoint in completed if not savepoint)
    keep = max(1, num_retained)
    return regular[:-keep] if len(regular) > keep else []


def protected_paths(
    retained: Iterable[CheckpointManifest],
    restored_from: Iterable[CheckpointManifest] = (),
    pending_paths: Iterable[str] = (),
) -> set[str]:
    """Paths that must not be deleted: everything a retained, restored-from or pending
    checkpoint references (``_metadata`` included)."""
    paths = set(pending_paths)
    for m in (*retained, *restored_from):
        paths |= m.referenced_paths()
    return paths


def deletable(
    files: Iterable[StoredFile],
    retained: Iterable[CheckpointManifest],
    *,
    now: float,
    grace_s: float,
    restored_from: Iterable[CheckpointManifest] = (),
    pending_ids: Iterable[int] = (),
    pending_paths: Iterable[str] = (),
) -> list[StoredFile]:
    """The files that may be deleted now, by the rules in this module's docstring.

    ``pending_ids`` protects whole ``chk-<n>/`` directories of pending checkpoints regardless of
    age; ``pending_paths`` protects individual files (shared uploads a pending checkpoint made).
    The claim of a checkpoint id above every retained one is kept whatever its age.
    """
    retained, restored_from = list(retained), list(restored_from)
    keep = protected_paths(retained, restored_from, pending_paths)
    pending = set(pending_ids)
    newest = max((m.checkpoint_id for m in [*retained, *restored_from]), default=0)
    cutoff = now - grace_s
    out: list[StoredFile] = []
    for f in files:
        if f.path in keep or f.modified > cutoff:
            continue
        cid = JobLayout.checkpoint_id_of(f.path)
        if cid in pending:
            continue
        if f.path.endswith("/" + JobLayout.CLAIM) and cid is not None and cid > newest:
            # an id above every retained checkpoint may still be in use by an attempt that
            # never completed it (a zombie); its claim keeps a newer attempt from taking it
            continue
        out.append(f)
    return out
