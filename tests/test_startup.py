"""The startup timeline: phases from the process start, and work done beside them."""

from __future__ import annotations

import time

from spark_jobs.driver.startup_phases import StartupTimeline, process_started_monotonic

COLLECTED_AT = time.monotonic()  # this module is imported while pytest collects, soon after start


def test_the_process_started_before_this_test_ran():
    started = process_started_monotonic()
    # before the collection, and not long before it (however long the suite has run since)
    assert 0 < COLLECTED_AT - started < 600


def test_phases_follow_each_other_and_overlapped_work_stands_apart():
    timeline = StartupTimeline(origin=time.monotonic() - 1.0)
    first = timeline.mark("spark session")
    time.sleep(0.05)
    second = timeline.mark("state restored")
    timeline.note_overlapped("attempt and checkpoint", 0.7)
    assert first >= 1.0 and second >= 0.05
    assert abs(timeline.total_s() - (first + second)) < 1e-9
    assert list(timeline.as_dict()) == [
        "spark session",
        "state restored",
        "(attempt and checkpoint)",
    ]
    line = timeline.summary()
    assert line.startswith(f"{timeline.total_s():.1f} s from the process start: spark session ")
    assert line.endswith("(beside them: attempt and checkpoint 0.7 s)")


def test_a_takeovers_timeline_says_its_origin_and_the_suites_report_reads_it():
    from tests.startup_report import phases

    timeline = StartupTimeline(time.monotonic() - 0.5, "the takeover's order")
    timeline.mark("waiting for the plan")
    timeline.mark("query started")
    line = "startup: " + timeline.summary()
    assert line.startswith("startup: 0.5 s from the takeover's order: waiting for the plan 0.5 s")
    counted = phases(line)  # the phases, not the total
    assert counted["query start"] >= 0.5 and counted["session"] == counted["restore"] == 0
