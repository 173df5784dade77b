"""The acknowledgement message: a subtask's answer to a checkpoint barrier (Flink's
AcknowledgeCheckpoint / DeclineCheckpoint), and where it travels.

A subtask writes its ack into durable storage once the asynchronous part of its snapshot is done;
the driver's ack poller reads it and hands it to the coordinator; retention GC reads the acks of
pending checkpoints to protect the files they name. This module is the one definition all three
use. An ack is addressed to one attempt: an older attempt's late ack for the same checkpoint id
lands in a different inbox and is never delivered to a newer attempt's coordinator.

Layout under the job root: ``_acks/a<attempt>/chk-<n>/<operator>-<subtask>.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from state.errors import BadInputError
from state.handles import SubtaskStateHandle
from state.paths import JobLayout, check_relative

ACKS_DIR = "_acks"


class AckError(BadInputError):
    """An ack document is malformed or does not belong where it was found."""


@dataclass(frozen=True)
class Ack:
    """A subtask's ack of checkpoint ``checkpoint_id`` in attempt ``attempt``: its state handle,
    or (a decline) the reason it could not take its snapshot."""

    attempt: int
    checkpoint_id: int
    operator: str
    subtask: int
    handle: SubtaskStateHandle | None = None
    declined: str | None = None

    def __post_init__(self) -> None:
        if (self.handle is None) == (self.declined is None):
            raise AckError("an ack carries either a handle or a decline reason")
        if self.handle is not None and (
            self.handle.checkpoint_id != self.checkpoint_id or self.handle.task != self.task
        ):
            raise AckError(
                f"handle {self.handle.task}@{self.handle.checkpoint_id} in the ack of "
                f"{self.task}@{self.checkpoint_id}"
            )

    @property
    def task(self) -> tuple[str, int]:
        return (self.operator, self.subtask)

    def to_json(self) -> bytes:
        doc = {
            "attempt": self.attempt,
            "checkpoint_id": self.checkpoint_id,
            "operator": self.operator,
            "subtask": self.subtask,
        }
        if self.handle is not None:
            doc["handle"] = self.handle.to_dict()
        else:
            doc["declined"] = self.declined
        return json.dumps(doc).encode()

    @classmethod
    def from_json(cls, data: bytes, *, source: str = "ack") -> Ack:
        try:
            doc = json.loads(data)
            handle = doc.get("handle")
            return cls(
                attempt=int(doc["attempt"]),
                checkpoint_id=int(doc["checkpoint_id"]),
                operator=check_relative(str(doc["operator"]), what="operator"),
                subtask=int(doc["subtask"]),
                handle=SubtaskStateHandle.from_dict(handle) if handle is not None else None,
                declined=str(doc["declined"]) if "declined" in doc else None,
            )
        except AckError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise AckError(f"{source}: malformed ack ({type(e).__name__}: {e})") from e


def inbox(attempt: int) -> str:
    """The directory (relative to the job root) holding attempt ``attempt``'s acks."""
    return f"{ACKS_DIR}/a{int(attempt)}"


def ack_path(layout: JobLayout, attempt: int, checkpoint_id: int, operator: str, subtask: int):
    """The storage path of one ack."""
    return layout.job_path(
        f"{inbox(attempt)}/{JobLayout.checkpoint_dir(checkpoint_id)}/{operator}-{int(subtask)}.json"
    )


def ack_location(relative: str) -> tuple[int, int] | None:
    """``(attempt, checkpoint id)`` of an ack path relative to the job root, else None."""
    parts = relative.split("/")
    if len(parts) != 4 or parts[0] != ACKS_DIR or not parts[1].startswith("a"):
        return None
    checkpoint_id = JobLayout.checkpoint_id_of(parts[2])
    if not parts[1][1:].isdigit() or checkpoint_id is None:
        return None
    return int(parts[1][1:]), checkpoint_id
