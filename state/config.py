"""Checkpoint configuration, with Flink's defaults where Flink has one.

A bad value fails at construction with a :class:`ConfigError` that names the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from state.errors import BadInputError
from state.file_codec import CODECS, DEFAULT_CODEC

EXACTLY_ONCE = "exactly_once"
AT_LEAST_ONCE = "at_least_once"


class ConfigError(BadInputError):
    """A configuration value is invalid; the message names the field."""


@dataclass(frozen=True)
class CheckpointConfig:
    """When checkpoints are taken, how long they may take, and how many are kept.

    interval_ms: time between checkpoint triggers (Flink has no default: checkpointing is off).
    min_pause_ms: minimum time from one completion to the next trigger (Flink: 0).
    max_concurrent: checkpoints pending at once (Flink: 1).
    timeout_ms: a pending checkpoint older than this is aborted (Flink: 10 minutes).
    tolerable_failed_checkpoints: consecutive failures tolerated before the job fails (Flink: 0).
    num_retained: completed checkpoints kept (Flink: 1).
    incremental: upload only the SST files the last confirmed checkpoint does not have
        (Flink: false).
    local_recovery: keep a secondary copy of each snapshot on the executor's disk and restore
        from it first (Flink: false).
    mode: ``exactly_once`` (two-phase-commit sinks) or ``at_least_once`` (Flink: exactly once).
    snapshot_compression: how state files are encoded in durable storage, ``zstd`` or ``none``
        (Flink: ``execution.checkpointing.snapshot-compression``, off). The working state and
        its local copies stay in RocksDB's uncompressed blocks, read in place; zstd shrinks
        the durable copy (state/file_codec.py).
    compaction_max_files / compaction_max_checkpoints: a subtask whose latest checkpoint
    references more files than this, or files uploaded by more checkpoints than this, is asked
    to compact its RocksDB at the next barrier (``cutline compact``; Flink has no equivalent).

    Incremental checkpoints and local recovery are on unless a job turns them off, where Flink
    has both off: Flink keeps state on the heap by default, where neither applies, and leaves
    them to the RocksDB user's choice. Cutline's state is always RocksDB, and these two are what
    make its checkpoints cheap (a checkpoint uploads the SST files that changed, not the whole
    state) and its restores fast (from the executor's own disk when the placement keeps it), so
    a job gets both without asking. A job turns them off to trade upload volume for a chain of
    one checkpoint (``incremental=False``) or to spare local disk (``local_recovery=False``).
    """

    interval_ms: int
    min_pause_ms: int = 0
    max_concurrent: int = 1
    timeout_ms: int = 600_000
    tolerable_failed_checkpoints: int = 0
    num_retained: int = 1
    incremental: bool = True
    local_recovery: bool = True
    mode: str = EXACTLY_ONCE
    snapshot_compression: str = DEFAULT_CODEC
    compaction_max_files: int = 64
    compaction_max_checkpoints: int = 16

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            expected = bool if f.type in ("bool", bool) else int if f.type in ("int", int) else str
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise ConfigError(f"checkpoint.{f.name} must be {expected.__name__}, got {value!r}")
        _at_least(self, "interval_ms", 1)
        _at_least(self, "min_pause_ms", 0)
        _at_least(self, "max_concurrent", 1)
        _at_least(self, "timeout_ms", 1)
        _at_least(self, "tolerable_failed_checkpoints", 0)
        _at_least(self, "num_retained", 1)
        _at_least(self, "compaction_max_files", 1)
        _at_least(self, "compaction_max_checkpoints", 1)
        if self.mode not in (EXACTLY_ONCE, AT_LEAST_ONCE):
            raise ConfigError(
                f"checkpoint.mode must be {EXACTLY_ONCE!r} or {AT_LEAST_ONCE!r}, got {self.mode!r}"
            )
        if self.snapshot_compression not in CODECS:
            raise ConfigError(
                f"checkpoint.snapshot_compression must be one of {', '.join(CODECS)}, "
                f"got {self.snapshot_compression!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckpointConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown checkpoint option(s): {', '.join(unknown)}")
        try:
            return cls(**d)
        except TypeError as e:
            raise ConfigError(f"checkpoint configuration: {e}") from e


def _at_least(cfg: CheckpointConfig, name: str, minimum: int) -> None:
    value = getattr(cfg, name)
    if value < minimum:
        raise ConfigError(f"checkpoint.{name} must be >= {minimum}, got {value}")
