"""What the driver does once the coordinator says a checkpoint is complete (its catalog row is
committed) or aborted: Flink's notifyCheckpointComplete on the driver's side.

Exactly once, the sinks commit their staged epochs through the checkpoint's (a failed commit
fails the attempt; the restore redoes it); the committed epochs' ends are forgotten; the
checkpoint's new shared files are registered in the catalog; a compaction request it served is
cleared; a savepoint it serves is written (driver/savepoints.py); it is reported. Runs on the
ack poller's thread (spark_jobs/driver/barrier.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cutline.sinks import SinkWriter
from spark_jobs.driver.barrier import CompactionRequests
from spark_jobs.driver.epoch_ends import EpochEnds
from spark_jobs.driver.run_state import RunState
from spark_jobs.driver.savepoints import SavepointRequests
from spark_jobs.events import EventChannel
from state.catalog import JobCatalog, shared_file_rows
from state.faults import kill_point
from state.manifest import CheckpointManifest


class Completion:
    """The coordinator's listener for one attempt."""

    def __init__(
        self,
        job_name: str,
        sinks: Sequence[SinkWriter],
        catalog: JobCatalog,
        ends: EpochEnds,
        compaction: CompactionRequests,
        savepoints: SavepointRequests,
        state: RunState,
        restored: CheckpointManifest | None,
        *,
        exactly_once: bool,
        log: Callable[[str], None],
        events: EventChannel,
    ) -> None:
        self.job_name, self.sinks, self.catalog = job_name, sinks, catalog
        self.ends, self.compaction, self.state = ends, compaction, state
        self.savepoints = savepoints
        self.exactly_once, self.log, self.events = exactly_once, log, events
        self._latest = restored
        self._known_shared = {f.path for f in restored.files() if f.shared} if restored else set()

    @property
    def committed(self) -> CheckpointManifest | None:
        """The latest completed checkpoint whose output is committed (or the one restored).
        Written on the ack thread only, after the sinks committed; read by the idle check
        (driver/micro_batches.py) without the ack thread's order: one reference, read whole,
        either the manifest before a completion or after it. An older one can only make the
        idle check see output that was committed meanwhile, which costs one barrier with no
        records; it never hides staged output, because the pointer only moves forward."""
        return self._latest

    def on_checkpoint_complete(self, record, manifest: CheckpointManifest) -> None:
        """Commit the sinks, then register, clear, write and report in order; any step that
        fails fails the attempt with its cause (the restore redoes what it left undone), and
        nothing after it happens."""
        kill_point("catalog-committed")
        step = "sink commit"
        try:
            committed = self._commit_sinks(manifest) if self.exactly_once else 0
            step = "registering its shared files"
            self._register_shared_files(manifest)
            step = "serving its compaction request"
            self.compaction.on_complete(manifest, self._latest.file_count if self._latest else 0)
            self._latest = manifest
            step = "serving its savepoint request"
            self.savepoints.on_complete(manifest)  # after the commit: a savepoint holds no staging
        except Exception as e:
            self.state.fail(f"{step} of checkpoint {manifest.checkpoint_id}: {e}", e)
            return
        self.log(
            f"checkpoint {manifest.checkpoint_id} complete: batch {manifest.batch_id}, "
            f"full {manifest.full_size:,} B, uploaded {manifest.uploaded_bytes:,} B, "
            f"sink rows committed {committed}"
        )
        self.events.emit("checkpoint", {**record.to_dict(), "counters": manifest.counters})
        self.state.checkpoint_completed(manifest.checkpoint_id)  # after its line and event

    def _commit_sinks(self, manifest: CheckpointManifest) -> int:
        """Exactly once: every sink commits its epochs through the checkpoint's, whose ends are
        then forgotten; returns the first sink's rows."""
        committed = 0
        for sink in self.sinks:
            epoch = manifest.sink_epochs.get(sink.sink)
            if epoch is not None:
                rows = sink.commit_through(epoch, manifest.epoch_ends, times=manifest.epoch_times)
                committed += rows if sink is self.sinks[0] else 0
        self.ends.forget_through(manifest.batch_id)
        return committed

    def on_checkpoint_aborted(self, checkpoint_id: int, reason: str) -> None:
        self.state.checkpoint_aborted(checkpoint_id)
        self.compaction.on_aborted(checkpoint_id)
        self.savepoints.on_aborted(checkpoint_id)
        self.log(f"checkpoint {checkpoint_id} aborted: {reason}")

    def on_job_failed(self, error: BaseException) -> None:
        self.state.fail(f"checkpointing failed: {error}", error)

    def _register_shared_files(self, manifest: CheckpointManifest) -> None:
        """Rows in ``shared_state_files`` for the shared files this checkpoint uploaded (GC
        keeps the rest of the rows in line with storage)."""
        new_files = shared_file_rows(manifest, self._known_shared)
        self._known_shared.update(f.path for f in manifest.files() if f.shared)
        if new_files:
            self.catalog.record_shared_files(new_files)
