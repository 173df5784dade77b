"""A user's jobs, run as a user runs them (``cutline run module:attr`` and installed entry
points) on real Spark: evolution by stage uid and state fingerprint, a function that raises, and
the clear errors of a job reference that does not resolve."""

from __future__ import annotations

import pytest

from spark_jobs.sources.generate import generate
from tests.e2e_util import completed_checkpoints, cutline, finish, last_line, report, run_to_end
from tests.reference import check, output, read_log
from tests.test_bad_records import BAD_LINES, log_with_bad_records
from tests.user_jobs import FAIL_AFTER

RUN = ["--until-caught-up", "--interval-ms", "1000", "--max-records-per-partition", "4000"]
SESSIONS = "cutline_sessions.jobs:sessions"
PIPELINE = "cutline_sessions.pipelines:country_clicks"


def latest_checkpoint(home) -> int:
    return max(c["checkpoint_id"] for c in completed_checkpoints(home, "sessions"))


def refused(home, *args: str) -> str:
    """Run ``cutline`` expecting exit 2; its last line."""
    run_to_end(home, *args, rc=2)
    return last_line(home)


def test_a_job_reference_that_does_not_resolve_is_a_clear_error(tmp_path):
    home = tmp_path / "home"
    line = refused(home, "run", "no_such_package.jobs:sessions")
    assert "job module 'no_such_package.jobs' cannot be imported" in line
    line = refused(home, "run", "cutline_sessions.jobs:no_such_job")
    assert "module 'cutline_sessions.jobs' has no attribute 'no_such_job'" in line
    line = refused(home, "run", "cutline_sessions.jobs:CLICKS_SCHEMA")
    assert "is a str, not a job definition" in line
    line = refused(home, "run", "no_such_job")
    assert "no job named 'no_such_job'" in line and "(registered: " in line
    assert "sessions" in line.split("(registered: ")[1]


@pytest.mark.slow
@pytest.mark.matrix("user jobs")
@pytest.mark.spark
def test_evolution_by_uid_and_state_fingerprint(tmp_path):
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=16_000, seed=7, users=3_000)
    run_to_end(home, "run", SESSIONS, *RUN, "--max-batches", "2")
    first = latest_checkpoint(home)

    # a changed state type is refused before anything runs, naming the stage and the state
    line = refused(home, "run", "tests.user_jobs:changed_type", *RUN)
    assert "stage 'sessionize' (uid 'sessionize'): state 'times' was stored as list<int64>" in line
    # a stage whose uid is gone is refused, and restores with --allow-non-restored-state
    line = refused(home, "run", "tests.user_jobs:new_uid", *RUN)
    assert "holds the state of stage uid 'sessionize', which the job has no stage for" in line
    assert latest_checkpoint(home) == first, "nothing ran"

    # the stage renamed with its uid kept restores its state; the output is exact
    generate(home / "log", "clicks", "clicks", count=4_000, seed=7, users=3_000)
    run_to_end(home, "run", "tests.user_jobs:renamed", *RUN)
    report(f"renamed stage, same uid: {check('sessions', home)}")
    assert f"restored checkpoint {first} " in (home / "driver.log").read_text()

    run_to_end(home, "run", "tests.user_jobs:new_uid", *RUN, "--allow-non-restored-state")
    assert "dropped (--allow-non-restored-state)" in (home / "driver.log").read_text()


@pytest.mark.slow
@pytest.mark.matrix("user jobs")
@pytest.mark.spark
def test_a_raising_function_fails_the_attempt_and_the_fixed_job_restores_exactly(tmp_path):
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=24_000, seed=7, users=3_000)
    fail_after = 1_767_225_600_000 + 12_000 * 10  # in the third micro-batch
    proc = cutline(home, "run", "tests.user_jobs:fragile", *RUN, env={FAIL_AFTER: str(fail_after)})
    assert finish(proc) == 2, (home / "driver.log").read_text()[-4000:]
    log = (home / "driver.log").read_text()
    assert "stage 'sessionize' (uid 'sessionize', Fragile.process_batch) raised ValueError" in log
    assert "in check" in log and "cannot sessionize it" in log  # the user's traceback
    assert completed_checkpoints(home, "sessions"), "checkpoints before the failure"
    run_to_end(home, "run", SESSIONS, *RUN)  # the fix: the job without the bug
    report(f"after a user function raised and was fixed: {check('sessions', home)}")


@pytest.mark.slow
@pytest.mark.matrix("user jobs")
@pytest.mark.spark
def test_a_pipeline_transform_sees_good_records_and_must_keep_the_runtime_columns(tmp_path):
    home = tmp_path / "home"
    log_with_bad_records(home, BAD_LINES)
    line = refused(home, "run", "tests.user_jobs:dropping_transform", *RUN)
    assert "transform 'parse' of source 'clicks' dropped the runtime's columns" in line
    line = refused(home, "run", "tests.user_jobs:raising_transform", *RUN)
    assert "transform 'parse' of source 'clicks' raised KeyError" in line
    # the bad records pass around the transform to the dead-letter table, once each
    run_to_end(home, "run", PIPELINE, *RUN, "--bad-records", "dead_letter")
    report(f"two stages, three sinks: {check('country_clicks', home)}")
    dead = output(home, "country_clicks_dead_letters").sort_values(["partition", "offset"])
    expected = read_log(home, "clicks", bad=True).sort_values(["partition", "offset"])
    assert dead[["partition", "offset", "raw"]].values.tolist() == (
        expected[["partition", "offset", "raw"]].values.tolist()
    )
