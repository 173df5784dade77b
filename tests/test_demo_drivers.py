"""``make demo`` on its way out kills only drivers its runs started: a pid from a run's tags whose
process died and was reused by another process is left alone."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestration.demo import started_by

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_driver_counts_only_while_it_names_its_run_worker():
    worker = os.getpid()
    driver = subprocess.Popen(SLEEP, env={**os.environ, "CUTLINE_WATCH_PID": str(worker)})
    stranger = subprocess.Popen(SLEEP, env={**os.environ, "CUTLINE_WATCH_PID": str(worker + 1)})
    unrelated = {k: v for k, v in os.environ.items() if k != "CUTLINE_WATCH_PID"}
    bystander = subprocess.Popen(SLEEP, env=unrelated)
    try:
        assert started_by(driver.pid, worker)
        assert not started_by(stranger.pid, worker)  # another run's driver
        assert not started_by(bystander.pid, worker)  # a process that reused a driver's pid
    finally:
        for proc in (driver, stranger, bystander):
            proc.kill()
            proc.wait()
    assert not started_by(driver.pid, worker)  # gone


def test_a_standby_supervisors_drivers_count_as_their_run_workers():
    worker = os.getpid()
    supervisor = subprocess.Popen(SLEEP, env={**os.environ, "CUTLINE_WATCH_PID": str(worker)})
    other = subprocess.Popen(SLEEP, env={**os.environ, "CUTLINE_WATCH_PID": str(worker + 1)})
    child = subprocess.Popen(SLEEP, env={**os.environ, "CUTLINE_WATCH_PID": str(supervisor.pid)})
    strangers = subprocess.Popen(SLEEP, env={**os.environ, "CUTLINE_WATCH_PID": str(other.pid)})
    try:
        assert started_by(supervisor.pid, worker) and started_by(child.pid, worker)
        assert not started_by(strangers.pid, worker)  # another run's supervisor's driver
    finally:
        for proc in (supervisor, other, child, strangers):
            proc.kill()
            proc.wait()


def test_the_demo_says_what_each_restore_run_restored_and_its_new_driver(tmp_path, capsys):
    """The demo's terminal tells a kill's outcome: for the sensor's restore run, once its
    attempt recorded what it restored, the job, the runs, the checkpoint and the new driver."""
    from dagster import DagsterRun

    from orchestration.demo import _tell_kill_instruction, dagster_env, instance
    from orchestration.partitions import DRIVER_PID_TAG, JOB_TAG, RESTORE_OF_TAG
    from spark_jobs.catalog.delta_catalog import DeltaCatalog
    from spark_jobs.deploy.settings import RuntimePaths

    home = tmp_path / "home"
    dagster_env(home)
    first, second = "a" * 32, "b" * 32
    job = "clicks_per_user"
    with instance(home) as inst:
        inst.add_run(DagsterRun("streaming_job", first, tags={JOB_TAG: job, DRIVER_PID_TAG: "11"}))
    runs, told = {job: first}, set()
    _tell_kill_instruction(home, runs, told)
    assert (
        capsys.readouterr().out
        == f"{job}: kill its driver to watch the automatic restore: kill -9 11\n"
    )

    restore = {JOB_TAG: job, DRIVER_PID_TAG: "22", RESTORE_OF_TAG: first}
    with instance(home) as inst:
        inst.add_run(DagsterRun("streaming_job", second, tags=restore))
    catalog = DeltaCatalog(RuntimePaths.under(home).catalog)
    attempt = catalog.begin_attempt(job, run_id=second)
    _tell_kill_instruction(home, runs, told)
    assert capsys.readouterr().out == "", "not before the attempt says what it restored"
    catalog.set_restored(job, attempt, 7, {"0": "127.0.0.1"})
    _tell_kill_instruction(home, runs, told)
    _tell_kill_instruction(home, runs, told)  # once
    assert capsys.readouterr().out.splitlines() == [
        f"{job}: restored by run bbbbbbbb after run aaaaaaaa failed: attempt {attempt} from "
        "checkpoint 7, driver pid 22",
        f"{job}: kill its driver to watch the automatic restore: kill -9 22",
    ]
    assert runs == {job: second}


def test_the_demo_says_how_to_kill_a_driver_with_a_standby_and_who_took_over(tmp_path, capsys):
    """With a standby: nothing until it is there, then the active driver's and the supervisor's
    pids; after a takeover, once the next standby is there, the driver that took over."""
    from dagster import DagsterRun

    from orchestration.demo import _tell_kill_instruction, dagster_env, instance
    from orchestration.partitions import DRIVER_PID_TAG, JOB_TAG, STANDBY_PID_TAG, SUBMIT_PID_TAG

    home = tmp_path / "home"
    dagster_env(home)
    run_id, job = "c" * 32, "clicks_per_user"
    tags = {JOB_TAG: job, SUBMIT_PID_TAG: "10", DRIVER_PID_TAG: "11", STANDBY_PID_TAG: "none"}
    with instance(home) as inst:
        inst.add_run(DagsterRun("streaming_job", run_id, tags=tags))
    runs, told = {job: run_id}, set()
    _tell_kill_instruction(home, runs, told)
    assert capsys.readouterr().out == "", "not before the standby is there"
    for tags in ({STANDBY_PID_TAG: "12"}, {DRIVER_PID_TAG: "12", STANDBY_PID_TAG: "none"},
                 {STANDBY_PID_TAG: "13"}):  # fmt: skip
        with instance(home) as inst:
            inst.add_run_tags(run_id, tags)
        _tell_kill_instruction(home, runs, told)
    assert capsys.readouterr().out.splitlines() == [
        f"{job}: kill its driver to watch its standby (12) take over: kill -9 11; kill both "
        "(their supervisor) to watch the automatic restore: kill -9 10",
        f"{job}: the standby took over in run cccccccc: driver pid 12",
        f"{job}: kill its driver to watch its standby (13) take over: kill -9 12; kill both "
        "(their supervisor) to watch the automatic restore: kill -9 10",
    ]
