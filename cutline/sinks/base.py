"""A sink: a definition in the job (:class:`Sink`) and, per attempt, its writer
(:class:`SinkWriter`), the one thing the runtime asks of an output.

Subtasks stage each epoch's output (cutline/sinks/staging.py); the writer commits it. Exactly
once: when a checkpoint completes, :meth:`SinkWriter.commit_through` commits every staged epoch
up to the checkpoint's, once, recording where each epoch ended in the sources; at least once,
:meth:`SinkWriter.append_now` commits each epoch right away. Every commit is fenced: once a
newer attempt has fenced the sink, an older one's commit fails with
:class:`~state.catalog.FencedError`. Implementations: the Delta append sink
(cutline/sinks/delta.py) and the Delta upsert sink (cutline/sinks/upsert.py). A new kind of
sink is a subclass of :class:`Sink` whose :meth:`~Sink.writer` returns a :class:`SinkWriter`;
the runtime needs no change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from state.manifest import Positions


class SinkWriter(Protocol):
    """One attempt's writer of one sink."""

    sink: str  # the sink's name in the job
    table_path: str  # where its output is (for messages)

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

    def upkeep(self) -> None:
        """Keep the output's own cost flat while the job runs (called now and then by the
        driver, never during a commit); nothing for an output that needs nothing."""


class Sink(ABC):
    """A sink in a job definition: ``name`` (unique in the job), the ``stage`` whose output it
    takes (None: the job's last stage), and :attr:`target`, what it writes to (unique in the
    job: two sinks never write one table)."""

    name: str
    stage: str | None

    @property
    @abstractmethod
    def target(self) -> str:
        """What the sink writes to, for uniqueness checks and messages."""

    @abstractmethod
    def writer(self, job_id: str, attempt: int, *, output: str, staging: str) -> SinkWriter:
        """The writer of attempt ``attempt`` of job ``job_id``: ``output`` is the deployment's
        output root and ``staging`` its staging root (each a local path or an ``s3://`` URL,
        reached by the driver and every executor alike)."""
