"""What a subtask's Spark task reports to the driver, one typed definition each: the statistics
of one micro-batch (:class:`SubtaskStats`) and the report of a new attempt's restore
(:class:`SubtaskRestoreReport`). The tasks create them (spark_jobs/executor/subtask.py), Spark
pickles them back to the driver, and the driver reads them by attribute; events and catalog rows
take :meth:`SubtaskRestoreReport.to_dict`, whose keys are the fields' names.

Executors import this module: it imports nothing of the driver's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from state.manifest import Positions


@dataclass(frozen=True)
class SubtaskStats:
    """One subtask of one stage in one micro-batch."""

    stage: str  # the stage's uid
    subtask: int
    host: str
    records: int  # well-formed records applied (from sources and upstream stages)
    output_rows: int
    positions: Positions  # of the sources it reads: per source and partition, after the last read
    sync_ms: float  # the synchronous part of the snapshot (0 without a barrier)
    compact_ms: float  # compaction before the snapshot (0 unless requested)
    late_records: int
    max_event_time: int | None  # of the records applied; None without event time or records
    bad_records: int
    first_bad: dict[str, Any] | None  # the dead-letter row of the first bad record, if any
    # per input (source, or upstream stage) and partition (or upstream subtask): the largest
    # event time of the well-formed records applied; empty without event time or records
    event_times: Positions = field(default_factory=dict)
    source_records: int = 0  # of ``records``, those read from sources
    task_ms: float = 0.0  # its part of the micro-batch: its store's open to its statistics


@dataclass(frozen=True)
class SubtaskRestoreReport:
    """How one subtask of one stage got its working state for a new attempt. ``source`` is
    ``empty`` (no checkpoint), ``local``, ``remote`` or ``mixed`` (where the bytes came from);
    ``corrupt`` is the positive evidence against the checkpoint when there was some (then
    nothing was restored); ``rescaled_from`` (the driver's): the subtasks of the checkpoint's
    parallelism whose state it took, when restored at another one. ``hint`` and ``placed`` are the
    driver's: the host the executor hint named, and whether an executor ran there."""

    stage: str
    subtask: int
    host: str
    source: str
    bytes_local: int = 0
    bytes_remote: int = 0
    files_local: int = 0
    files_remote: int = 0
    fallbacks: tuple[str, ...] = ()
    duration_ms: float = 0.0
    corrupt: str | None = None
    hint: str | None = None
    placed: bool = False
    rescaled_from: tuple[int, ...] = ()  # the old subtasks its state came from, when rescaled
    # rescaled from several old subtasks: how they were joined, "files" (state/sst_merge.py) or
    # "keys: <why their files could not be>"
    joined: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The report as events and catalog rows carry it (JSON-ready)."""
        return {
            **asdict(self),
            "fallbacks": list(self.fallbacks),
            "rescaled_from": list(self.rescaled_from),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SubtaskRestoreReport:
        """A report from :meth:`to_dict`'s form; a key it does not know is a ``TypeError``."""
        return cls(
            **{
                **raw,
                "fallbacks": tuple(raw.get("fallbacks", ())),
                "rescaled_from": tuple(raw.get("rescaled_from", ())),
            }
        )
