"""Placement helpers without Spark: which host each subtask prefers, and which subtasks a lost
host takes along."""

from __future__ import annotations

from spark_jobs.driver.placement import lost_subtasks, preferred_hosts, spark_host_for


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
