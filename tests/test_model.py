"""Model-based test: checkpoints, acks, aborts, timeouts, subsumption, GC and restores in random
orders, against a simple reference model of what must survive.

The system under test is the real coordinator, incremental uploader, registry rules, manifest and
restore over real local storage; the subtasks' RocksDB directories are simulated by directories of
immutable "SST" files that are added and compacted (merged into new files), which is all the
incremental protocol sees of RocksDB. Invariants, after every step:

* no file referenced by a retained or pending checkpoint (or the restored-from one) is deleted;
* after GC, no unreferenced file older than the grace period remains;
* the retained checkpoints are exactly the newest ``num_retained`` completed ones.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from state.catalog import CheckpointStatus
from state.config import CheckpointConfig
from state.coordinator import AckResult, CheckpointCoordinator
from state.keygroups import KeyGroupRange
from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.registry import StoredFile, deletable, refcounts
from state.restore import restore_subtask
from state.snapshot import upload_snapshot
from state.storage import LocalFileStorage
from tests.fakes import FaultyStorage, InMemoryCatalog

JOB = "model"
TASKS = [("op", 0), ("op", 1)]
TIMEOUT_MS = 5_000
GRACE_MS = 6_000  # >= timeout: anything a live pending checkpoint uploaded is younger than this
NUM_RETAINED = 2


class SimulatedDb:
    """A directory of immutable SST files, as RocksDB's live files look to a snapshot."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.next_number = 10
        self.live: list[str] = []

    def new_file(self) -> str:
        name = f"{self.next_number:06d}.sst"
        self.next_number += 1
        (self.root / name).write_bytes(os.urandom(16))
        return name

    def flush(self) -> None:
        self.live.append(self.new_file())

    def compact(self, k: int) -> None:
        merged, self.live = self.live[:k], self.live[k:]
        self.live.insert(0, self.new_file())
        for name in merged:
            (self.root / name).unlink()

    def snapshot(self, directory: Path) -> None:
        directory.mkdir(parents=True)
        for name in self.live:
            os.link(self.root / name, directory / name)
        (directory / "MANIFEST-000001").write_bytes(os.urandom(8))
        (directory / "CURRENT").write_bytes(b"MANIFEST-000001\n")

    def reset_to(self, names: list[str]) -> None:
        for name in self.live:
            (self.root / name).unlink(missing_ok=True)
        self.live = sorted(n for n in names if n.endswith(".sst"))
        for n in self.live:
            (self.root / n).write_bytes(b"restored")
        self.next_number = max([self.next_number, *(int(n[:6]) + 1 for n in self.live)])


class CheckpointModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="cutline-model-"))
        self.storage = FaultyStorage(LocalFileStorage(self.tmp / "remote"))
        self.layout = JobLayout(JOB)
        self.catalog = InMemoryCatalog()
        self.dbs = {t: SimulatedDb(self._mkdir(f"db-{t[1]}")) for t in TASKS}
        self.now = 0
        self.upload_time: dict[str, int] = {}  # path -> model time it was written
        self.in_flight: list[tuple[CheckpointCoordinator, int, tuple, object]] = []
        self.completed: list[int] = []  # reference model: every completed checkpoint id
        self.restored_from: CheckpointManifest | None = None
        self.old_coordinators: list[CheckpointCoordinator] = []
        self.fenced_at: dict[int, int] = {}  # attempt -> last checkpoint id it could complete
        self.coord = self._new_coordinator(None)

    def _mkdir(self, name: str) -> Path:
        p = self.tmp / name
        p.mkdir(parents=True)
        return p

    def _new_coordinator(self, restored: CheckpointManifest | None) -> CheckpointCoordinator:
        return CheckpointCoordinator(
            JOB,
            self.catalog.begin_attempt(JOB),
            CheckpointConfig(
                interval_ms=1,
                max_concurrent=3,
                timeout_ms=TIMEOUT_MS,
                num_retained=NUM_RETAINED,
                tolerable_failed_checkpoints=10**6,
            ),
            TASKS,
            self.storage,
            self.catalog,
            restored=restored,
            now_ms=self.now,
        )

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _record_uploads(self) -> None:
        for path in self.storage.puts:
            rel = path.split("/", 1)[1]
            self.upload_time.setdefault(rel, self.now)
        self.storage.puts.clear()

    def _manifest(self, checkpoint_id: int) -> CheckpointManifest:
        data = self.storage.get_bytes(self.layout.job_path(self.layout.metadata(checkpoint_id)))
        return CheckpointManifest.from_json(data)

    def _retained_manifests(self) -> list[CheckpointManifest]:
        rows = self.catalog.checkpoints(JOB, (CheckpointStatus.COMPLETED,))
        return [self._manifest(r.checkpoint_id) for r in rows]

    def _protected(self) -> set[str]:
        paths: set[str] = set()
        for m in self._retained_manifests():
            paths |= m.referenced_paths()
        if self.restored_from is not None:
            paths |= self.restored_from.referenced_paths()
        for coord, cid, _task, handle in self.in_flight:
            if coord is self.coord and cid in coord.pending_ids():
                paths |= {f.path for f in handle.files}
        return paths | self.coord.pending_paths()

    # -- rules -------------------------------------------------------------------------------

    @rule(task=st.sampled_from(TASKS))
    def flush(self, task):
        self.dbs[task].flush()

    @rule(task=st.sampled_from(TASKS), k=st.integers(2, 4))
    def compact(self, task, k):
        db = self.dbs[task]
        if len(db.live) >= k:
            db.compact(k)

    @rule(dt=st.integers(1, 4_000))
    def advance_time(self, dt):
        self.now += dt
        self.coord.expire(self.now)

    @rule(fail_task=st.sampled_from([None, *TASKS]))
    def trigger_and_snapshot(self, fail_task):
        pending = self.coord.trigger(0, {"src": {"0": self.now}}, self.now)
        if pending is None:
            return
        cid = pending.checkpoint_id
        for task in TASKS:
            directory = self.tmp / f"snap-{task[1]}-{cid}-{self.coord.attempt}"
            self.dbs[task].snapshot(directory)
            base = self.coord.base_handle(task)
            if task == fail_task:  # the upload dies after the first file
                count = {"n": 0}

                def second_put_fails(path, count=count):
                    count["n"] += 1
                    return count["n"] >= 2

                self.storage.fail_put = second_put_fails
            try:
                handle = upload_snapshot(
                    self.storage, self.layout, *task, cid, directory, KeyGroupRange(0, 1), base
                )
            except OSError:
                self.coord.decline(cid, task, "upload failed")
                continue
            finally:
                self.storage.fail_put = lambda path: False
                self._record_uploads()
                shutil.rmtree(directory)
            self.in_flight.append((self.coord, cid, task, handle))

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data())
    def deliver_ack(self, data):
        i = data.draw(st.integers(0, len(self.in_flight) - 1))
        coord, cid, task, handle = self.in_flight.pop(i)
        result = coord.acknowledge(cid, task, handle, self.now)
        self._record_uploads()  # _metadata
        committed = {r.checkpoint_id for r in self.catalog.checkpoints(JOB)}
        if result is AckResult.COMPLETED and coord is self.coord and cid in committed:
            self.completed.append(cid)
            self.restored_from = None  # a later checkpoint completed after the restore
        if coord is not self.coord and result is AckResult.COMPLETED:
            assert coord.failure is not None, "a fenced attempt's completion must fail"

    @rule()
    def gc(self):
        files = [
            StoredFile(
                info.path.split("/", 1)[1], info.size, self.upload_time[info.path.split("/", 1)[1]]
            )
            for info in self.storage.list(JOB)
        ]
        retained = self._retained_manifests()
        doomed = deletable(
            files,
            retained,
            now=self.now,
            grace_s=GRACE_MS,
            restored_from=[self.restored_from] if self.restored_from else [],
            pending_ids=self.coord.pending_ids(),
            pending_paths=self.coord.pending_paths(),
        )
        protected = self._protected()
        for f in doomed:
            assert f.path not in protected, f"GC would delete {f.path}, which is still referenced"
        self.storage.delete_many([self.layout.job_path(f.path) for f in doomed])
        remaining = {i.path.split("/", 1)[1] for i in self.storage.list(JOB)}
        newest = max((m.checkpoint_id for m in retained), default=0)
        if self.restored_from is not None:
            newest = max(newest, self.restored_from.checkpoint_id)
        claims = {  # of ids an attempt may still use: kept whatever their age
            p for p in remaining if p.endswith("/_claim") and JobLayout.checkpoint_id_of(p) > newest
        }
        for path in remaining - protected - claims:
            assert self.upload_time[path] > self.now - GRACE_MS, f"{path} should have been deleted"

    @precondition(lambda self: self.completed)
    @rule()
    def fail_and_restore(self):
        """The attempt dies; a new one restores every subtask from the latest checkpoint."""
        self.old_coordinators.append(self.coord)
        self.fenced_at[self.coord.attempt] = max(
            (r.checkpoint_id for r in self.catalog.checkpoints(JOB)), default=0
        )
        latest = self.catalog.checkpoints(JOB, (CheckpointStatus.COMPLETED,))[-1]
        manifest = self._manifest(latest.checkpoint_id)
        for handle in manifest.subtasks:
            target = self.tmp / f"restore-{handle.subtask}-{self.now}-{len(self.old_coordinators)}"
            restore_subtask(handle, self.storage, self.layout, target)
            self.dbs[handle.task].reset_to([f.local_name for f in handle.files])
            shutil.rmtree(target)
        self.restored_from = manifest
        self.coord = self._new_coordinator(manifest)

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def referenced_files_exist(self):
        stored = {i.path.split("/", 1)[1] for i in self.storage.list(JOB)}
        missing = self._protected() - stored
        assert not missing, f"referenced files were deleted: {sorted(missing)}"

    @invariant()
    def retained_are_the_newest_completed(self):
        rows = self.catalog.checkpoints(JOB, (CheckpointStatus.COMPLETED,))
        assert [r.checkpoint_id for r in rows] == sorted(self.completed)[-NUM_RETAINED:]
        counts = refcounts(self._retained_manifests())
        assert all(1 <= c <= NUM_RETAINED for c in counts.values())

    @invariant()
    def no_old_attempt_completes_after_a_newer_one_started(self):
        for r in self.catalog.checkpoints(JOB):
            if r.attempt in self.fenced_at:
                assert r.checkpoint_id <= self.fenced_at[r.attempt], f"fenced attempt completed {r}"


CheckpointModel.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCheckpointModel = CheckpointModel.TestCase
