"""Checkpoint ids: each is claimed exclusively before anything is written under it.

``<job>/chk-<n>/_claim`` is created with an exclusive write naming the claiming attempt, so two
attempts (a zombie and its successor, or a savepoint's import and a running attempt) never take
the same id, and GC knows which ids were ever used.
"""

from __future__ import annotations

import json

from state.paths import JobLayout
from state.storage import AlreadyExistsError, DurableStorage, StorageError


def claim_checkpoint_id(
    storage: DurableStorage, layout: JobLayout, attempt: int, first: int, limit: int = 100_000
) -> tuple[int, int]:
    """The lowest id from ``first`` that attempt ``attempt`` could claim, and how many ids it
    found taken on the way. Raises :class:`StorageError` when none of ``limit`` ids is free."""
    claim = json.dumps({"attempt": attempt}).encode()
    for checkpoint_id in range(first, first + limit):
        try:
            storage.put_bytes(layout.job_path(layout.claim(checkpoint_id)), claim, exclusive=True)
            return checkpoint_id, checkpoint_id - first
        except AlreadyExistsError:
            continue
    raise StorageError(f"no free checkpoint id in {first}..{first + limit - 1}")
