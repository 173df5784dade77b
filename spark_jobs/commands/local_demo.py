"""An in-process run of the checkpoint core, before the Spark runtime exists: ``cutline demo``.

A keyed count over a replayable two-partition source, with ``parallelism`` subtasks on RocksDB,
checkpoints every few micro-batches (sync snapshot at the cut, asynchronous upload, acks to the
coordinator, completion, local-copy pruning), then a crash, a restore from the latest completed
checkpoint (local copies first, sources rewound), and the rest of the input. The final counts are
compared with a reference computed without failure: nothing lost, nothing duplicated.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from state.catalog import CheckpointStatus, CompletedCheckpoint
from state.config import CheckpointConfig
from state.coordinator import CheckpointCoordinator
from state.keygroups import key_group_range, key_groups, subtask_for_key_group
from state.local_copies import LocalCopies
from state.memory_catalog import InMemoryCatalog
from state.paths import JobLayout
from state.restore import RestoreReport, read_manifest, restore_subtask
from state.rocksdb_store import RocksDBStore
from state.snapshot import SubtaskSnapshotter
from state.storage import LocalFileStorage

JOB = "demo_counts"
OPERATOR = "count"
SOURCE = "clicks"
PARTITIONS = 2
MAX_PARALLELISM = 128


@dataclass
class DemoResult:
    completed: list[CompletedCheckpoint]
    restored_from: int | None
    restore_reports: list[RestoreReport]
    exact: bool
    counted: int
    expected: int


class _Confirm:
    """Checkpoint listener: prunes the subtasks' local copies once a checkpoint completes."""

    def __init__(self, copies: list[LocalCopies]) -> None:
        self.copies = copies

    def on_checkpoint_complete(self, checkpoint, manifest) -> None:
        for c in self.copies:
            c.confirm(checkpoint.checkpoint_id)

    def on_checkpoint_aborted(self, checkpoint_id, reason) -> None:
        for c in self.copies:
            c.discard(checkpoint_id)

    def on_job_failed(self, error) -> None:
        pass


class _Attempt:
    """One attempt of the job: a coordinator and the subtasks' snapshotters."""

    def __init__(self, home: Path, catalog: InMemoryCatalog, parallelism: int, restored) -> None:
        self.storage = LocalFileStorage(home / "checkpoints")
        self.copies = [
            LocalCopies(home / "local-state", JOB, OPERATOR, i) for i in range(parallelism)
        ]
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="demo-upload")
        self.snapshotters = [
            SubtaskSnapshotter(
                self.storage, c, JOB, OPERATOR, i, incremental=True, executor=self.pool
            )
            for i, c in enumerate(self.copies)
        ]
        self.coordinator = CheckpointCoordinator(
            JOB,
            catalog.begin_attempt(JOB),
            CheckpointConfig(interval_ms=3, num_retained=2, incremental=True, local_recovery=True),
            [(OPERATOR, i) for i in range(parallelism)],
            self.storage,
            catalog,
            listeners=[_Confirm(self.copies)],
            restored=restored,
        )
        self.futures: list[Future] = []


def _source(seed: int, events_per_partition: int, users: int) -> list[np.ndarray]:
    return [
        np.random.default_rng([seed, p]).integers(0, users, events_per_partition)
        for p in range(PARTITIONS)
    ]


def _process_batch(
    attempt: _Attempt,
    users: np.ndarray,
    parallelism: int,
    checkpoint_id: int | None,
    now_ms: int,
) -> None:
    """One micro-batch: every subtask runs (also without records) and snapshots at a barrier."""
    keys = pa.array([f"user-{u}" for u in users.tolist()], pa.string())
    groups = key_groups(keys, "string", MAX_PARALLELISM)
    owners = subtask_for_key_group(groups, parallelism, MAX_PARALLELISM)
    for i in range(parallelism):
        mine = np.flatnonzero(owners == i)
        unique, first, counts = np.unique(
            keys.take(pa.array(mine)).to_numpy(zero_copy_only=False),
            return_index=True,
            return_counts=True,
        )
        kg_range = key_group_range(i, parallelism, MAX_PARALLELISM)
        store = RocksDBStore(attempt.copies[i].db_dir, kg_range)
        try:
            k = [u.encode() for u in unique.tolist()]
            g = groups[mine][first]
            old = store.get_many("count", g, k)
            new = [int(o or b"0") + int(c) for o, c in zip(old, counts.tolist(), strict=True)]
            txn = store.begin()
            txn.put("count", g, k, [str(n).encode() for n in new])
            txn.commit()
            if checkpoint_id is not None:
                task = (OPERATOR, i)
                future = attempt.snapshotters[i].snapshot(
                    store, checkpoint_id, attempt.coordinator.base_handle(task)
                )
                future.add_done_callback(_ack(attempt.coordinator, checkpoint_id, task, now_ms))
                attempt.futures.append(future)
        finally:
            store.close()


def _ack(coordinator: CheckpointCoordinator, checkpoint_id: int, task, now_ms: int):
    def done(future: Future) -> None:
        if future.exception() is not None:
            coordinator.decline(checkpoint_id, task, repr(future.exception()))
        else:
            coordinator.acknowledge(checkpoint_id, task, future.result(), now_ms)

    return done


def _counts(attempt: _Attempt, parallelism: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in range(parallelism):
        kg_range = key_group_range(i, parallelism, MAX_PARALLELISM)
        with RocksDBStore(attempt.copies[i].db_dir, kg_range) as store:
            for kg in kg_range:
                out.update((k.decode(), int(v)) for k, v in store.items("count", kg))
    return out


def run_demo(
    home: Path,
    *,
    parallelism: int = 2,
    batches: int = 24,
    batch_size: int = 5_000,
    users: int = 50_000,
    crash_after: int = 14,
    seed: int = 42,
    lose_local_copies: bool = False,
    log=print,
) -> DemoResult:
    """Run the demo under ``home`` (wiped first) and return what happened.

    ``lose_local_copies`` drops the local snapshot copies at the crash, forcing remote restores.
    """
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    source = _source(seed, batches * (batch_size // PARTITIONS), users)
    catalog = InMemoryCatalog()
    attempt = _Attempt(home, catalog, parallelism, restored=None)
    positions = {str(p): 0 for p in range(PARTITIONS)}
    restored_from: int | None = None
    reports: list[RestoreReport] = []
    batch = 0
    crashed = False
    while batch < batches:
        ends = {p: positions[p] + batch_size // PARTITIONS for p in positions}
        records = np.concatenate([source[int(p)][positions[p] : ends[p]] for p in positions])
        now_ms = batch
        attempt.coordinator.expire(now_ms)
        pending = attempt.coordinator.trigger(batch, {SOURCE: ends}, now_ms)
        _process_batch(attempt, records, parallelism, pending and pending.checkpoint_id, now_ms)
        positions = ends
        batch += 1
        if batch == crash_after and not crashed:
            crashed = True
            log(f"-- crash after micro-batch {batch}: working state and in-flight uploads lost")
            old = attempt
            attempt = None
            latest = catalog.checkpoints(JOB, (CheckpointStatus.COMPLETED,))[-1]
            manifest = read_manifest(old.storage, latest.metadata_path)
            attempt = _Attempt(home, catalog, parallelism, restored=manifest)  # fences `old`
            wait(old.futures)
            old.pool.shutdown()
            if lose_local_copies:  # as if the executors came back on new hosts
                for c in attempt.copies:
                    for cid in c.checkpoint_ids():
                        c.discard(cid)
            for i in range(parallelism):
                handle = manifest.handle(OPERATOR, i)
                report = restore_subtask(
                    handle,
                    attempt.storage,
                    JobLayout(JOB),
                    attempt.copies[i].db_dir,
                    attempt.copies[i],
                )
                reports.append(report)
                log(
                    f"   subtask {i}: restored checkpoint {manifest.checkpoint_id} "
                    f"({report.source}: {report.bytes_local} B local, "
                    f"{report.bytes_remote} B remote, {report.duration_s * 1000:.0f} ms)"
                )
            restored_from = manifest.checkpoint_id
            positions = dict(manifest.source_positions[SOURCE])
            batch = manifest.batch_id + 1
            log(f"   sources rewound to {positions}; resuming at micro-batch {batch}")
    wait(attempt.futures)
    attempt.pool.shutdown()
    counts = _counts(attempt, parallelism)
    reference = np.bincount(np.concatenate(source), minlength=users)
    expected = {f"user-{u}": int(c) for u, c in enumerate(reference.tolist()) if c}
    completed = catalog.checkpoints(JOB)
    for c in completed:
        log(
            f"checkpoint {c.checkpoint_id:3d} (attempt {c.attempt}, batch {c.batch_id:3d}): "
            f"{c.status.value:9s} full {c.full_size:>9,} B  uploaded {c.incremental_size:>9,} B  "
            f"sync {c.sync_ms:6.1f} ms  async {c.async_ms:6.1f} ms"
        )
    result = DemoResult(
        completed=completed,
        restored_from=restored_from,
        restore_reports=reports,
        exact=counts == expected,
        counted=sum(counts.values()),
        expected=int(reference.sum()),
    )
    log(
        f"counted {result.counted:,} events for {len(counts):,} users; reference "
        f"{result.expected:,}: {'EXACT' if result.exact else 'MISMATCH'}"
    )
    return result


def main_demo(home: Path) -> int:
    started = time.perf_counter()
    result = run_demo(home)
    print(f"state and checkpoints under {home} ({time.perf_counter() - started:.1f} s)")
    return 0 if result.exact else 1
