"""State handles: what a subtask's snapshot consists of, enough to restore it anywhere."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from state.file_codec import NONE, check_codec
from state.keygroups import KeyGroupRange
from state.paths import check_relative


@dataclass(frozen=True)
class StateFile:
    """One file of a snapshot: its name in the RocksDB checkpoint and its copy in storage.

    ``path`` is relative to the job root: ``shared/...`` for immutable SST files that later
    checkpoints may re-reference, ``chk-<n>/...`` for files private to checkpoint n. ``size`` and
    ``checksum`` are the file's own bytes (as RocksDB wrote them); its copy in storage is
    encoded with ``codec`` (state/file_codec.py) and holds :attr:`stored_size` bytes.
    """

    local_name: str
    path: str
    size: int
    checksum: str
    codec: str = NONE
    stored: int | None = None  # the stored copy's bytes, when encoded

    @property
    def shared(self) -> bool:
        return self.path.startswith("shared/")

    @property
    def stored_size(self) -> int:
        """Bytes of the copy in durable storage (what storage lists, copies and deletes)."""
        return self.size if self.stored is None else self.stored

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "local_name": self.local_name,
            "path": self.path,
            "size": self.size,
            "checksum": self.checksum,
        }
        if self.codec != NONE:
            d.update(codec=self.codec, stored_size=self.stored_size)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StateFile:
        local_name = check_relative(str(d["local_name"]), what="local_name")
        if "/" in local_name:
            raise ValueError(f"local_name {local_name!r} must be a plain file name")
        size, stored = d["size"], d.get("stored_size", d["size"])
        for name, n in (("size", size), ("stored_size", stored)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(
                    f"{name} of {local_name!r} must be a non-negative integer, got {n!r}"
                )
        codec = check_codec(str(d.get("codec", NONE)), what=f"codec of {local_name!r}")
        return cls(
            local_name=local_name,
            path=check_relative(str(d["path"]), what="file path"),
            size=size,
            checksum=str(d["checksum"]),
            codec=codec,
            stored=None if codec == NONE else stored,
        )


@dataclass(frozen=True)
class SubtaskStateHandle:
    """The snapshot of one subtask of one operator for one checkpoint.

    ``uploaded_bytes`` counts what this snapshot wrote to durable storage (the increment);
    ``full_size`` is what it holds there in all (what a remote restore reads).
    """

    operator: str
    subtask: int
    key_group_range: KeyGroupRange
    checkpoint_id: int
    files: tuple[StateFile, ...]
    uploaded_bytes: int = 0
    sync_ms: float = 0.0
    async_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def task(self) -> tuple[str, int]:
        return (self.operator, self.subtask)

    @property
    def full_size(self) -> int:
        return sum(f.stored_size for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "operator": self.operator,
            "subtask": self.subtask,
            "key_group_range": self.key_group_range.to_list(),
            "checkpoint_id": self.checkpoint_id,
            "files": [f.to_dict() for f in self.files],
            "uploaded_bytes": self.uploaded_bytes,
            "sync_ms": self.sync_ms,
            "async_ms": self.async_ms,
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SubtaskStateHandle:
        return cls(
            operator=check_relative(str(d["operator"]), what="operator"),
            subtask=int(d["subtask"]),
            key_group_range=KeyGroupRange.from_list(d["key_group_range"]),
            checkpoint_id=int(d["checkpoint_id"]),
            files=tuple(StateFile.from_dict(f) for f in d["files"]),
            uploaded_bytes=int(d.get("uploaded_bytes", 0)),
            sync_ms=float(d.get("sync_ms", 0.0)),
            async_ms=float(d.get("async_ms", 0.0)),
            extra=dict(d.get("extra", {})),
        )
