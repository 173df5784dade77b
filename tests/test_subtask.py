"""A subtask's task (spark_jobs/executor/subtask.py) on real RocksDB, without Spark."""

from __future__ import annotations

import time

from cutline_examples.jobs import clicks_per_user

from spark_jobs.executor.dataflow import empty_input
from spark_jobs.executor.subtask import BatchPlan, RunContext, prepare_subtask, run_subtask
from state.rocksdb_options import StoreOptions
from state.rocksdb_store import RocksDBStore


def _level0(ctx: RunContext, uid: str) -> int:
    """Level 0's files of subtask 0's working state (an open that waits for any release)."""
    with RocksDBStore(ctx.copies(uid, 0).db_dir, ctx.key_groups(0), compactions=False) as s:
        return s.db.property_int_value("rocksdb.num-files-at-level0")


def test_an_attempts_first_micro_batch_starts_no_compaction_and_its_next_one_does(tmp_path):
    """A restored state may have a level-0 compaction due (the checkpoint was taken before the
    killed attempt's compaction ended): the new attempt's first micro-batch, which a restart
    waits for, leaves it for the next one instead of sharing the cores with it."""
    ctx = RunContext(clicks_per_user(), 3, str(tmp_path / "c"), str(tmp_path / "l"), str(tmp_path))
    op = ctx.job.stages[0]
    prepare_subtask(ctx, op.uid, 0, (), epoch=4)  # the restore: empty, marked at epoch 4
    options = StoreOptions()  # the store's own defaults, which run_subtask opens with
    bound = options.l0_max_files
    first = ctx.key_groups(0).start
    for i in range(bound):  # level 0 at its bound: a compaction is due at the next open
        with RocksDBStore(ctx.copies(op.uid, 0).db_dir, ctx.key_groups(0), compactions=False) as s:
            txn = s.begin()  # files that overlap, as flushes of a micro-batch's keys do (files
            # that do not are moved down whole, not compacted)
            txn.put("filler", [first, first], [b"k", b"k%d" % i], [b"v" * 64, b"v" * 64])
            txn.commit()
    records = empty_input(op)

    run_subtask(BatchPlan(ctx, epoch=5, previous_epoch=4, compactions=False), 0, 0, records)
    assert _level0(ctx, op.uid) > bound  # its own flush on top: none ran

    # the next micro-batches compact it (a task with no records may end before the compaction
    # its open scheduled starts running, and cancel it: the next open schedules it again)
    for epoch in (6, 7, 8):
        run_subtask(BatchPlan(ctx, epoch=epoch, previous_epoch=epoch - 1), 0, 0, records)
        if _level0(ctx, op.uid) < options.l0_compaction_trigger:
            return
    raise AssertionError(f"level 0 not compacted by three micro-batches: {_level0(ctx, op.uid)}")


def test_a_subtasks_statistics_time_its_own_task(tmp_path):
    """``task_ms``, the subtask's part of a micro-batch (the ``batch`` event reports the
    slowest): more than nothing, never more than the call took."""
    ctx = RunContext(clicks_per_user(), 3, str(tmp_path / "c"), str(tmp_path / "l"), str(tmp_path))
    op = ctx.job.stages[0]
    prepare_subtask(ctx, op.uid, 0, (), epoch=4)
    started = time.perf_counter()
    stats, _ = run_subtask(BatchPlan(ctx, epoch=5, previous_epoch=4), 0, 0, empty_input(op))
    assert 0 < stats.task_ms <= (time.perf_counter() - started) * 1000
