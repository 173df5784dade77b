"""A standby's warm-up query (spark_jobs/driver/warm_up.py): it runs one micro-batch over the
job's own sources and stops, reads without writing, and a failure of it is only logged."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from cutline.sources.log import with_log_root
from cutline.sources.log_format import partition_path
from spark_jobs.driver.warm_up import WARM_READ, warm_up_job, warm_up_query
from spark_jobs.job_loader import get_job
from spark_jobs.sources.generate import generate

pytestmark = pytest.mark.spark


def files_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def test_the_warm_up_query_runs_a_micro_batch_of_the_job_and_leaves_nothing(spark, tmp_path):
    log = tmp_path / "log"
    generate(log, "clicks", "clicks", count=500, seed=3, users=50)
    before = files_under(tmp_path)
    job = get_job("clicks_per_user")
    lines: list[str] = []
    seconds = warm_up_query(spark, with_log_root(job, str(log)), lines.append)
    assert seconds is not None and seconds > 0, lines
    assert any("warm-up query over the job's sources ran a micro-batch" in x for x in lines)
    assert not spark.streams.active, "stopped"
    assert files_under(tmp_path) == before, "it only read"
    # this process's (spark_jobs/driver/scratch.py names them by pid): a standby of a test
    # beside this one may be warming up the same job at this moment
    mine = f"cutline-{job.name}-warm-up-query-{os.getpid()}-*"
    left = list(Path(tempfile.gettempdir()).glob(mine))
    assert not left, f"its scratch checkpoint is removed: {left}"


def test_the_warm_up_reads_a_bounded_number_of_records_over_all_partitions(tmp_path):
    """However many partitions its sources have (a file source's directory may hold thousands
    of files), the warm-up's one micro-batch reads about ``read`` records in all, and never more
    per partition than the job's own micro-batches."""
    log = tmp_path / "log"
    generate(log, "clicks", "clicks", count=40, partitions=4, seed=3, users=50)
    job = with_log_root(get_job("clicks_per_user"), str(log))
    (own,) = {s.max_records_per_partition for s in job.sources}

    def bounds(read: int) -> list[int]:
        return [s.max_records_per_partition for s in warm_up_job(job, read).sources]

    assert bounds(1_000) == [250] and own > 250
    assert bounds(2) == [1], "one record a partition at least"
    assert bounds(100 * own) == [own], "never a bigger micro-batch than the job's own"
    assert warm_up_job(job).sources[0].max_records_per_partition == min(own, WARM_READ // 4)


def test_a_failed_warm_up_query_is_logged_and_stops(spark, tmp_path):
    job = with_log_root(get_job("clicks_per_user"), str(tmp_path / "empty"))
    lines: list[str] = []
    assert warm_up_query(spark, job, lines.append) is None
    assert any("warm-up query failed" in x and "no partitions" in x for x in lines), lines
    assert not spark.streams.active


def test_a_warm_up_query_over_sources_without_records_ends_at_once(spark, tmp_path):
    """Spark runs a first micro-batch even when it reads nothing (its offsets are new): the
    warm-up ends with it, not at its timeout."""
    log = tmp_path / "log"
    for partition in (0, 1):  # partitions, no records
        path = partition_path(log, "clicks", partition)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    job = with_log_root(get_job("clicks_per_user"), str(log))
    lines: list[str] = []
    started = time.monotonic()
    warm_up_query(spark, job, lines.append, timeout_s=60)
    assert time.monotonic() - started < 30, lines
    assert not spark.streams.active
