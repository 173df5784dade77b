"""The keyed-state interface every state backend provides (Quix Streams' layering).

A backend holds the keyed state of one subtask: keys are always addressed together with their key
group, so a subtask's state can be split or merged by key-group range. All access is vectorised:
one call reads or writes a whole micro-batch's keys. Writes go through a :class:`Transaction`
whose explicit states make a partial micro-batch impossible to persist by accident.
"""

from __future__ import annotations

import enum
import errno
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from state.errors import BadInputError
from state.keygroups import KeyGroupRange

KeyGroups = Sequence[int] | np.ndarray
Keys = Sequence[bytes]


class TransactionState(enum.Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


class TransactionError(RuntimeError):
    """A transaction was used after it was committed or aborted."""


class KeyGroupError(BadInputError):
    """A key group outside the subtask's range was read or written: state would be misplaced."""


class StateBackendError(RuntimeError):
    """The state backend itself failed (an I/O error, a full disk, a corrupt file): the
    runtime's failure, which a restore may fix, never the user's code, even when raised under
    a user's function reading its state."""


def disk_full(error: BaseException) -> bool:
    """Whether ``error`` says a disk is full, as Python (``ENOSPC``) or RocksDB says it."""
    return getattr(error, "errno", None) == errno.ENOSPC or "No space left on device" in str(error)


def corrupt_file(error: BaseException) -> bool:
    """Whether ``error`` is RocksDB finding a file's bytes not what it wrote (a block or
    footer whose checksum does not match)."""
    return "Corruption:" in str(error)


class Transaction(ABC):
    """Buffered writes of one micro-batch; applied atomically by :meth:`commit`.

    Reads made during the transaction see committed state only (operators read a batch's keys
    with one multi-get, compute, then write them back). ``commit`` after ``abort`` (or twice)
    raises :class:`TransactionError`.
    """

    state: TransactionState

    @abstractmethod
    def put(
        self, name: str, key_groups: KeyGroups, keys: Keys, values: Sequence[bytes]
    ) -> None: ...

    @abstractmethod
    def delete(self, name: str, key_groups: KeyGroups, keys: Keys) -> None: ...

    @abstractmethod
    def commit(self) -> None: ...

    @abstractmethod
    def abort(self) -> None: ...


class KeyedStateBackend(ABC):
    """Keyed state of one subtask; owns the key groups in :attr:`key_group_range`."""

    key_group_range: KeyGroupRange

    @abstractmethod
    def get_many(self, name: str, key_groups: KeyGroups, keys: Keys) -> list[bytes | None]:
        """Value of state ``name`` for every (key group, key); ``None`` where absent."""

    @abstractmethod
    def begin(self) -> Transaction:
        """Start a transaction for one micro-batch's writes."""

    @abstractmethod
    def snapshot_to(self, directory: Path) -> None:
        """Synchronous part of a snapshot: persist a consistent, immutable copy in ``directory``."""

    @abstractmethod
    def close(self) -> None: ...
