"""Placement helpers: which host each subtask prefers, and which subtasks a lost host takes
along (without Spark); the anchor a micro-batch's tasks are pinned through (with it)."""

from __future__ import annotations

import pytest

from spark_jobs.driver.placement import (
    anchor_rdd,
    lost_subtasks,
    pin_to_anchor,
    preferred_hosts,
    spark_host_for,
    subtask_partition,
)


def test_a_hinted_host_is_preferred_only_where_an_executor_runs():
    spark_hosts = {"127.0.0.2", "127.0.0.3"}
    allocation = {"0": "127.0.0.2", "1": "127.0.0.3", "2": "gone.invalid", "3": "localhost"}
    assert preferred_hosts(allocation, 5, spark_hosts) == [
        ["127.0.0.2"],
        ["127.0.0.3"],
        [],  # the host is gone: no preference, the subtask goes where Spark has room
        [],  # localhost is 127.0.0.1: no executor there
        [],  # no hint
    ]


def test_a_hint_matches_the_executor_host_by_name_or_address():
    assert spark_host_for("localhost", {"127.0.0.1", "127.0.0.9"}) == "127.0.0.1"
    assert spark_host_for("127.0.0.1", {"localhost"}) == "localhost"
    assert spark_host_for("nothing.invalid", {"127.0.0.1"}) is None


def test_a_host_without_executors_is_lost_with_the_subtasks_it_held():
    allocation = {"0": "127.0.0.2", "1": "127.0.0.3", "2": "127.0.0.2", "3": "127.0.0.3"}
    assert lost_subtasks(allocation, {"127.0.0.2", "127.0.0.3"}) == {}
    assert lost_subtasks(allocation, {"127.0.0.2"}) == {"127.0.0.3": [1, 3]}
    assert lost_subtasks(allocation, set()) == {"127.0.0.2": [0, 2], "127.0.0.3": [1, 3]}


@pytest.mark.spark
def test_the_anchor_unions_partition_by_partition_with_a_micro_batchs_shuffle(spark):
    """The anchor, built in the JVM, has PySpark's partitioner for ``subtask_partition`` and its
    serializer: a micro-batch shuffled with ``partitionBy(p, subtask_partition)`` unions with it
    partition by partition (no re-serialising map, no second shuffle), and partition *i* holds
    the batch's items for subtask *i* and the anchor's ``(i, None)`` twice."""
    sc = spark.sparkContext
    hosts = [["localhost"], []]  # a preferred host, and none
    anchor = anchor_rdd(sc, hosts)
    assert anchor.glom().collect() == [[(0, None)], [(1, None)]]
    batch = sc.parallelize([(1, "b"), (0, "a"), (1, "c")], 3).partitionBy(2, subtask_partition)
    pinned = pin_to_anchor(batch, anchor)
    assert pinned._jrdd.rdd().getClass().getSimpleName() == "PartitionerAwareUnionRDD"
    assert [sorted(p, key=repr) for p in pinned.glom().collect()] == [
        [(0, "a"), (0, None), (0, None)],
        [(1, "b"), (1, "c"), (1, None), (1, None)],
    ]
