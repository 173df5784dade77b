"""What the runtime asks of a sink (one attempt's writer of one output): :class:`Sink`.

Subtasks stage each epoch's output (spark_jobs/executor/subtask.py); the sink commits it.
Exactly once: when a checkpoint completes, :meth:`Sink.commit_through` commits every staged
epoch up to the checkpoint's, once, recording where each epoch ended in the sources; at least
once, :meth:`Sink.append_now` commits each epoch right away. Every commit is fenced: once a
newer attempt has fenced the sink, an older one's commit fails with
:class:`~state.catalog.FencedError`. The implementation is the Delta sink
(spark_jobs/sinks/delta_sink.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from state.manifest import Positions


class Sink(Protocol):
    sink: str  # the sink's name in the job
    table_path: str  # where its output is (for messages)
    staging_root: Path  # where subtasks stage epochs for it

    def fence(self) -> None:
        """From now on no older attempt commits (creating the output if missing)."""

    def committed_epoch(self) -> int:
        """The last epoch committed (-1 if none)."""

    def has_output(self) -> bool:
        """Whether the output holds anything."""

    def committed_ends(self, after: int) -> dict[int, Positions]:
        """Where each committed epoch above ``after`` ended; ``LookupError`` if unknown."""

    def committed_times(self, after: int) -> dict[int, int]:
        """The planned processing time of each committed epoch above ``after``, where the
        commit recorded it."""

    def discard_other_attempts(self) -> None:
        """Drop what other attempts staged."""

    def commit_through(
        self,
        epoch: int,
        ends: dict[int, Positions],
        *,
        staged_by: int | None = None,
        times: dict[int, int] | None = None,
    ) -> int:
        """Commit the staged epochs up to ``epoch`` not yet committed, recording the ends and
        planned processing times (``times``) of those epochs; the rows committed."""

    def append_now(
        self, epoch: int, ends: dict[int, Positions], times: dict[int, int] | None = None
    ) -> int:
        """At least once: commit epoch ``epoch`` now; the rows committed."""

    def reset(self) -> int:
        """Delete all output (an explicit start-over); the rows deleted."""
