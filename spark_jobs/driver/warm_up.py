"""What a driver runs before its work needs it, so that its first micro-batch costs about what a
steady one does.

- :func:`warm_up_workers`: Spark's Python workers started, with what a micro-batch's map side
  imports loaded; every start does it beside its restore, but a takeover (its standby did).
- :func:`warm_up_query`: a standby's throwaway streaming query over the job's own sources,
  transforms and map side (every partition's first records, up to ``WARM_READ`` in all, through
  ``foreachBatch`` and the subtask shuffle), run to its first micro-batch and stopped. A new JVM
  spends seconds loading, interpreting and compiling the streaming engine's code, the sources'
  readers and each plan's generated code on its first query, and more on the hot loops a
  micro-batch of many records runs; the takeover's query finds them done (docs/design.md,
  section 14, has the figures). It only reads; what it writes is its own scratch checkpoint,
  removed after it. A cold start gains nothing from it: its own query is the first either way.

Both are best effort: a failure is logged and costs only the time they would have saved.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from collections.abc import Callable

from cutline.job import JobDefinition
from spark_jobs.driver.startup_phases import StartupTimeline

# The warm-up query's one micro-batch reads up to WARM_READ records over every partition of
# every source, never more per partition than the job's own micro-batches: a takeover's first
# micro-batch about 0.2 s sooner at 100 MiB and 0.5 s at 1 GiB than with 64 records a partition
# (bench/results/README.md).
WARM_READ = 200_000
WARM_TIMEOUT_S = 120.0  # a warm-up query that has not run its micro-batch by then is given up


def warm_up_workers(spark, parallelism: int, timeline: StartupTimeline, log) -> None:
    """Start the Python workers of Spark's SQL side (they are not the restore's) and load what
    they run, with a tiny job of the first micro-batch's shape, beside the restore: a cold start
    of them made the first micro-batch take about twice as long as the next ones."""
    from spark_jobs.executor.subtask import warm_up_worker

    started = time.perf_counter()
    try:
        (
            spark.range(parallelism, numPartitions=parallelism)
            .mapInArrow(warm_up_worker, "id long")
            .mapInArrow(warm_up_worker, "id long")
            .collect()
        )
    except Exception as e:
        log(f"warming up Python workers failed (the first micro-batch does it): {e}")
        return
    timeline.note_overlapped("Python workers warmed", time.perf_counter() - started)


def warm_up_job(job: JobDefinition, read: int = WARM_READ) -> JobDefinition:
    """``job`` with its sources' micro-batch bound lowered so that one micro-batch reads at most
    ``read`` records over all their partitions (at least one record a partition; sources must
    be dataclasses)."""
    partitions = sum(len(source.current_partitions()[0]) for source in job.sources)
    each = max(1, read // max(1, partitions))
    return dataclasses.replace(job, sources=tuple(
        dataclasses.replace(s, max_records_per_partition=min(each, s.max_records_per_partition))
        for s in job.sources
    ))  # fmt: skip


def warm_up_query(
    spark, job: JobDefinition, log: Callable[[str], None], timeout_s: float = WARM_TIMEOUT_S
) -> float | None:
    """Run the throwaway query (see the module docstring) to the end of its first micro-batch
    and stop it; its seconds, or None if it failed (logged). ``job``'s sources must be rooted
    (a local log's directory set). It needs executors: a standby on a cluster that has none
    (the active application holds the cores) does without it."""
    from spark_jobs.driver.epoch_ends import source_starts
    from spark_jobs.driver.placement import subtask_partition
    from spark_jobs.driver.scratch import query_scratch
    from spark_jobs.driver.watch import caught_up
    from spark_jobs.executor.dataflow import chunk_items, map_side
    from spark_jobs.sources.frames import read_routes, stream_input

    started = time.perf_counter()
    ran = threading.Event()

    def one_batch(df, _batch_id: int) -> None:
        if not ran.is_set():  # to the subtasks' shuffle; the stages need state: not run
            items = chunk_items(df) if routes else map_side(df, job)[1]
            items.partitionBy(job.parallelism, subtask_partition).count()
            ran.set()

    scratch = query_scratch(f"{job.name}-warm-up")  # a killed standby's is removed later
    query = None
    try:  # a source of the user's own kind may not be a dataclass: then no warm-up
        few = warm_up_job(job)
        starts = source_starts(few, {})
        routes = read_routes(spark, few)
        query = (
            stream_input(spark, few, starts, routes)
            .writeStream.foreachBatch(one_batch)
            .option("checkpointLocation", scratch)
            .queryName(f"cutline-{job.name}-warm-up")
            .start()
        )
        deadline = time.monotonic() + timeout_s
        while not ran.wait(0.1):
            if query.exception() is not None or not query.isActive:
                raise RuntimeError(str(query.exception() or "the query stopped"))
            if caught_up(query.status) and not ran.is_set():  # no micro-batch would come
                raise RuntimeError("its sources have no records yet")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no micro-batch in {timeout_s:.0f} s")
        seconds = time.perf_counter() - started
        log(f"standby: a warm-up query over the job's sources ran a micro-batch in {seconds:.1f} s")
        return seconds
    except Exception as e:
        log(f"the standby's warm-up query failed (the takeover's query does its work): {e}")
        return None
    finally:
        if query is not None:
            try:
                query.stop()
            except Exception as e:
                log(f"stopping the standby's warm-up query: {e}")
        shutil.rmtree(scratch, ignore_errors=True)
