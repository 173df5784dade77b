"""State handles: what a subtask's snapshot consists of, enough to restore it anywhere."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from state.keygroups import KeyGroupRange
from state.paths import check_relative

_CHUNK = 4 << 20


def file_checksum(path: str | Path) -> str:
    """CRC-32 of a file's contents, as ``crc32:<8 hex digits>``."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"crc32:{crc:08x}"


@dataclass(frozen=True)
class StateFile:
    """One file of a snapshot: its name in the RocksDB checkpoint and its copy in storage.

    ``path`` is relative to the job root: ``shared/...`` for immutable SST files that later
    checkpoints may re-reference, ``chk-<n>/...`` for files private to checkpoint n.
    """

    local_name: str
    path: str
    size: int
    checksum: str

    @property
    def shared(self) -> bool:
        return self.path.startswith("shared/")

    def to_dict(self) -> dict[str, Any]:
        return {
            "local_name": self.local_name,
            "path": self.path,
            "size": self.size,
            "checksum": self.checksum,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StateFile:
        local_name = check_relative(str(d["local_name"]), what="local_name")
        if "/" in local_name:
            raise ValueError(f"local_name {local_name!r} must be a plain file name")
        size = d["size"]
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"size of {local_name!r} must be a non-negative integer, got {size!r}")
        return cls(
            local_name=local_name,
            path=check_relative(str(d["path"]), what="file path"),
            size=size,
            checksum=str(d["checksum"]),
        )


@dataclass(frozen=True)
class SubtaskStateHandle:
    """The snapshot of one subtask of one operator for one checkpoint.

    ``uploaded_bytes`` counts what this snapshot wrote to durable storage (the increment);
    ``full_size`` is what a restore reads.
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
        return sum(f.size for f in self.files)

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
