"""Where each micro-batch (epoch) ended in the sources, and where a new attempt's micro-batches
start: the record that lets a restore replay committed epochs exactly instead of emitting their
output again (docs/design.md, section 5).

Every micro-batch records its end and the processing time it was planned with (a replay runs it
with the same, so timers, TTL and idle partitions come out the same); a checkpoint's cut carries
the ends and times of the epochs the sinks have not committed yet (so a sink commit can record
them in its Delta commit info), and they are forgotten once the sinks committed them. A restore
from a checkpoint older than the sinks' last committed epoch reads the ends and times of the
epochs in between from the sinks' commit history.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from cutline.job import JobDefinition
from cutline.sinks import SinkWriter
from spark_jobs.errors import NoRestorableCheckpointError
from state.manifest import CheckpointManifest, Positions


class EpochEnds:
    """The ends of the epochs the sinks have not committed (micro-batches record them on the
    stream thread, checkpoint completion forgets them on the ack thread), and the committed ones
    read for a restore (the main thread, then the restore thread). Thread-safe: ``_lock`` guards
    both maps; ``_reading`` makes a sink's history be read once per checkpoint without holding
    ``_lock`` (and with it the micro-batches) across the read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reading = threading.Lock()  # taken before ``_lock``, never inside it
        self._uncommitted: dict[int, Positions] = {}
        self._times: dict[int, int] = {}  # the uncommitted epochs' planned processing times
        self._history: dict[int, dict[int, Positions]] = {}  # sink history after an epoch
        self._history_times: dict[int, dict[int, int]] = {}

    def record(
        self, epoch: int, ends: Positions, processing_time: int | None = None
    ) -> dict[int, Positions]:
        """``epoch``, planned at ``processing_time``, ended at ``ends``; returns every
        uncommitted epoch's end (for a cut)."""
        with self._lock:
            self._uncommitted[epoch] = ends
            if processing_time is not None:
                self._times[epoch] = processing_time
            return dict(self._uncommitted)

    def times(self, epochs: Iterable[int]) -> dict[int, int]:
        """The planned processing times of those of ``epochs`` recorded and not forgotten."""
        with self._lock:
            return {e: self._times[e] for e in epochs if e in self._times}

    def forget_through(self, epoch: int) -> None:
        """The sinks committed every epoch up to ``epoch``."""
        with self._lock:
            self._uncommitted = {e: p for e, p in self._uncommitted.items() if e > epoch}
            self._times = {e: t for e, t in self._times.items() if e > epoch}

    def restore(self, manifest: CheckpointManifest, committed: int) -> None:
        """Start from ``manifest``'s record of the epochs its sinks had not committed, less those
        committed since (``committed``: the sinks' last committed epoch)."""
        with self._lock:
            self._uncommitted = {e: p for e, p in manifest.epoch_ends.items() if e > committed}
            self._times = {e: t for e, t in manifest.epoch_times.items() if e > committed}

    def replay_times(self, manifest: CheckpointManifest) -> dict[int, int]:
        """The planned processing times of the epochs after ``manifest``'s that are known (from
        the last :meth:`committed_through` read and this attempt's record); older records
        lack them."""
        with self._lock:
            return {
                **manifest.epoch_times,
                **self._times,
                **self._history_times.get(manifest.batch_id, {}),
            }

    def committed_through(
        self, manifest: CheckpointManifest, through: int, sinks: Sequence[SinkWriter]
    ) -> dict[int, Positions]:
        """Where each epoch after ``manifest``'s ended, up to ``through``: from the commit
        history of the sink that committed furthest, and the checkpoint's own record of its
        epochs the sinks had not committed. Raises :class:`NoRestorableCheckpointError` when an
        epoch's end is unknown: it could not be replayed exactly."""
        with self._reading:  # read once per checkpoint: the start and the restore both need it
            with self._lock:
                ends = self._history.get(manifest.batch_id)
            if ends is None:
                sink = max(sinks, key=lambda s: s.committed_epoch())
                try:
                    ends = sink.committed_ends(manifest.batch_id)
                    times = sink.committed_times(manifest.batch_id)
                except LookupError as e:
                    raise NoRestorableCheckpointError(
                        f"restoring checkpoint {manifest.checkpoint_id} would emit committed "
                        f"output again: {e}"
                    ) from e
                with self._lock:
                    self._history[manifest.batch_id] = ends
                    self._history_times[manifest.batch_id] = times
        with self._lock:
            known = {**self._uncommitted, **ends}
        missing = [e for e in range(manifest.batch_id + 1, through + 1) if e not in known]
        if missing:
            raise NoRestorableCheckpointError(
                f"restoring checkpoint {manifest.checkpoint_id}: no record of where epochs "
                f"{missing} ended, so they cannot be replayed exactly"
            )
        return known


def source_starts(job: JobDefinition, base: Positions) -> Positions:
    """Every partition each source has now, from its position in ``base`` or, if it has none
    there, from its beginning."""
    positions: Positions = {}
    for name in job.source_inputs:
        parts, unread = job.source(name).current_partitions()
        start = base.get(name, {})
        positions[name] = {str(p): int(start.get(str(p), unread)) for p in parts}
    return positions


def starting_point(
    job: JobDefinition,
    manifest: CheckpointManifest | None,
    committed: int,
    exactly_once: bool,
    ends: EpochEnds,
    sinks: Sequence[SinkWriter],
) -> tuple[int, Positions]:
    """The epoch a new attempt's micro-batches continue after, and the positions they read from:
    the checkpoint's (partitions it does not name: from their start), or, exactly once when the
    sinks committed epochs after it (``committed``), where the last committed epoch ended,
    which the restore reaches by replaying those epochs."""
    positions = source_starts(job, manifest.source_positions if manifest else {})
    if manifest is None:
        return committed, positions  # epochs continue above the sinks' committed ones
    if not exactly_once:
        return max(manifest.batch_id, committed), positions
    if committed <= manifest.batch_id:
        ends.restore(manifest, committed)
        return manifest.batch_id, positions
    for name, parts in ends.committed_through(manifest, committed, sinks)[committed].items():
        positions.setdefault(name, {}).update(parts)
    return committed, positions
