"""The checkpoint manifest (``chk-<n>/_metadata``): a self-contained, versioned JSON document.

Restore needs only the manifest and the files it names; the catalog can be rebuilt from manifests.
Reading validates the version, every field's type and every path (no path may leave the job root),
and raises :class:`ManifestError` naming what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from state.errors import BadInputError
from state.handles import StateFile, SubtaskStateHandle
from state.paths import JobLayout, PathEscapeError, check_relative

MANIFEST_VERSION = 1
Positions = dict[str, dict[str, int]]  # source -> partition -> position after the last record


@dataclass(frozen=True)
class PartitionClock:
    """One input partition of a stage (a source partition, or an upstream subtask): the largest
    event time of its records so far, and the processing time (ms, as the driver planned the
    micro-batch) of the last micro-batch that had records of it."""

    max_event_time: int
    last_records_ms: int


# per stage uid: input (source, or upstream stage) -> partition -> clock
PartitionClocks = dict[str, dict[str, dict[str, PartitionClock]]]


class ManifestError(BadInputError):
    """A manifest is unreadable, of an unknown version, malformed, or names an escaping path."""


@dataclass(frozen=True)
class CheckpointManifest:
    job_id: str
    checkpoint_id: int
    batch_id: int
    attempt: int
    trigger_time_ms: int
    source_positions: dict[str, dict[str, int]]
    subtasks: tuple[SubtaskStateHandle, ...]
    sink_epochs: dict[str, int] = field(default_factory=dict)
    watermarks: dict[str, int] = field(default_factory=dict)
    savepoint: bool = False
    version: int = MANIFEST_VERSION
    # source positions at the end of each epoch not committed to the sinks before this cut (the
    # sinks record them with the commit: a later fallback replays those epochs exactly)
    epoch_ends: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)  # e.g. bad records so far
    # every stateful stage's uid -> its states' fingerprints (state name -> stored form): what a
    # restore checks the job against (spark_jobs/driver/evolution.py)
    stages: dict[str, dict[str, str]] = field(default_factory=dict)
    # the planned processing time (ms) of each epoch in ``epoch_ends``: a replay runs it again
    # with the same clock (absent in older manifests)
    epoch_times: dict[int, int] = field(default_factory=dict)
    # what the per-partition watermarks are computed from (absent in older manifests: the
    # restored ``watermarks`` are the floor, the partitions start unseen)
    partition_clocks: PartitionClocks = field(default_factory=dict)
    # written from tables with no checkpoint under it (state/savepoint_writer.py): a job that
    # restores it starts another history, whatever its name
    bootstrapped: bool = False

    # -- figures -----------------------------------------------------------------------------

    def files(self) -> Iterator[StateFile]:
        for handle in self.subtasks:
            yield from handle.files

    @property
    def full_size(self) -> int:
        return sum(f.stored_size for f in self.files())

    @property
    def uploaded_bytes(self) -> int:
        return sum(h.uploaded_bytes for h in self.subtasks)

    @property
    def file_count(self) -> int:
        return sum(len(h.files) for h in self.subtasks)

    def shared_paths(self) -> set[str]:
        return {f.path for f in self.files() if f.shared}

    def referenced_paths(self) -> set[str]:
        """Every path (relative to the job root) this checkpoint needs, ``_metadata`` included."""
        paths = {f.path for f in self.files()}
        paths.add(JobLayout.checkpoint_dir(self.checkpoint_id) + "/" + JobLayout.METADATA)
        paths.add(JobLayout.checkpoint_dir(self.checkpoint_id) + "/" + JobLayout.CLAIM)
        return paths

    def handle(self, operator: str, subtask: int) -> SubtaskStateHandle | None:
        for h in self.subtasks:
            if h.operator == operator and h.subtask == subtask:
                return h
        return None

    # -- serialisation -----------------------------------------------------------------------

    def to_json(self) -> bytes:
        doc = {
            "version": self.version,
            "job_id": self.job_id,
            "checkpoint_id": self.checkpoint_id,
            "batch_id": self.batch_id,
            "attempt": self.attempt,
            "trigger_time_ms": self.trigger_time_ms,
            "savepoint": self.savepoint,
            "bootstrapped": self.bootstrapped,
            "source_positions": self.source_positions,
            "sink_epochs": self.sink_epochs,
            "watermarks": self.watermarks,
            "epoch_ends": {str(e): p for e, p in self.epoch_ends.items()},
            "counters": self.counters,
            "stages": self.stages,
            "epoch_times": {str(e): t for e, t in self.epoch_times.items()},
            "partition_clocks": {
                uid: {
                    src: {p: [c.max_event_time, c.last_records_ms] for p, c in parts.items()}
                    for src, parts in inputs.items()
                }
                for uid, inputs in self.partition_clocks.items()
            },
            "subtasks": [h.to_dict() for h in self.subtasks],
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "_metadata") -> CheckpointManifest:
        """Parse and validate; ``source`` names the file in error messages."""
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise ManifestError(f"{source}: not valid JSON ({e})") from e
        if not isinstance(doc, dict):
            raise ManifestError(f"{source}: expected a JSON object")
        version = doc.get("version")
        if version != MANIFEST_VERSION:
            raise ManifestError(
                f"{source}: manifest version {version!r} is not supported "
                f"(this Cutline reads version {MANIFEST_VERSION})"
            )
        try:
            job_id = JobLayout(str(doc["job_id"])).job_id
            manifest = cls(
                job_id=job_id,
                checkpoint_id=_int(doc, "checkpoint_id"),
                batch_id=_int(doc, "batch_id"),
                attempt=_int(doc, "attempt"),
                trigger_time_ms=_int(doc, "trigger_time_ms"),
                savepoint=bool(doc.get("savepoint", False)),
                bootstrapped=bool(doc.get("bootstrapped", False)),
                source_positions=_positions(doc["source_positions"]),
                sink_epochs={str(k): int(v) for k, v in dict(doc.get("sink_epochs", {})).items()},
                watermarks={str(k): int(v) for k, v in dict(doc.get("watermarks", {})).items()},
                epoch_ends={
                    int(e): _positions(p) for e, p in dict(doc.get("epoch_ends", {})).items()
                },
                counters={str(k): int(v) for k, v in dict(doc.get("counters", {})).items()},
                stages={
                    str(uid): {str(n): str(f) for n, f in dict(states).items()}
                    for uid, states in dict(doc.get("stages", {})).items()
                },
                subtasks=tuple(SubtaskStateHandle.from_dict(h) for h in doc["subtasks"]),
                epoch_times={
                    int(e): _int_value(t) for e, t in dict(doc.get("epoch_times", {})).items()
                },
                partition_clocks=_clocks(doc.get("partition_clocks", {})),
            )
        except PathEscapeError as e:
            raise ManifestError(f"{source}: {e}") from e
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ManifestError(f"{source}: malformed manifest ({type(e).__name__}: {e})") from e
        manifest._check_paths(source)
        return manifest

    def _check_paths(self, source: str) -> None:
        own_dir = JobLayout.checkpoint_dir(self.checkpoint_id) + "/"
        seen: set[tuple[str, int]] = set()
        for h in self.subtasks:
            if h.task in seen:
                raise ManifestError(f"{source}: subtask {h.task} appears twice")
            seen.add(h.task)
            for f in h.files:
                check_relative(f.path, what="file path")
                if f.shared:
                    continue
                chk = JobLayout.checkpoint_id_of(f.path)
                if chk != self.checkpoint_id:
                    raise ManifestError(
                        f"{source}: file {f.path!r} is neither shared nor private to this "
                        f"checkpoint (under {own_dir!r})"
                    )


def _positions(doc: Any) -> dict[str, dict[str, int]]:
    return {
        str(src): {str(p): int(o) for p, o in dict(parts).items()} for src, parts in doc.items()
    }


def _clocks(doc: Any) -> PartitionClocks:
    out: PartitionClocks = {}
    for uid, inputs in dict(doc).items():
        stage = out.setdefault(str(uid), {})
        for src, parts in dict(inputs).items():
            stage[str(src)] = {}
            for p, pair in dict(parts).items():
                high, last = (_int_value(v) for v in pair)
                stage[str(src)][str(p)] = PartitionClock(high, last)
    return out


def _int_value(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _int(doc: dict[str, Any], name: str) -> int:
    value = doc[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"field {name!r} must be an integer, got {value!r}")
    return value
