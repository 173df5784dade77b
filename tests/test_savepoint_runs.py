"""Savepoints of a running job, end to end with real Spark, Delta and the moto S3 server
(spark_jobs/driver/savepoints.py, state/savepoint.py).

clicks_per_user runs over a log that grows while it runs; the restore drill reads its latest
checkpoint beside it. ``cutline savepoint`` takes a savepoint of it at a barrier. Once it has
read all its input, a few clicks more are made to arrive right after a barrier, so that their
micro-batch carries none and its output waits: the barrier with no records that commits it must
fire while the job is idle (its log line is awaited), and the committed output then holds every
click. A savepoint of the idle job is its latest committed checkpoint; then a stop-with-savepoint
stops it. The job's GC runs; neither savepoint changes. The first is moved to another bucket on
the S3 server (the original deleted) and restored there under another job name, whose output
from the savepoint on is exactly what pandas computes from the whole input; the second is moved
to another directory and the job itself restores it and reads new clicks, its whole output
(counts going on from the savepoint's state) exactly the reference's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid

import numpy as np
import pandas as pd
import pytest

from spark_jobs.catalog.tables import CatalogReader
from spark_jobs.commands.state_read import restore_drill
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.job_loader import get_job
from spark_jobs.sources.generate import generate
from spark_jobs.state_processor import write_savepoint
from state.savepoint import read_savepoint
from state.storage import LocalFileStorage, S3Storage, open_storage
from tests.e2e_util import (
    ROOT,
    checkpoints_so_far,
    cutline,
    finish,
    kill_driver,
    report,
    run_to_end,
    wait_for,
)
from tests.reference import (
    EPOCH,
    before_cut,
    check,
    expect_clicks_per_user,
    job_cuts,
    output,
    read_log,
)
from tests.row_check import compare_rows
from tests.test_savepoint import copy_tree

JOB = "clicks_per_user"


def command(home, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def savepoint(home, *args: str) -> dict:
    """``cutline savepoint JOB ARGS --json``: its catalog row."""
    done = command(home, "savepoint", JOB, *args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.landing
@pytest.mark.spark
@pytest.mark.s3
def test_savepoints_move_and_restore_under_any_name_and_outlive_gc(tmp_path, s3_server):
    home = tmp_path / "home"
    paths = RuntimePaths.under(home)
    (home / "log").mkdir(parents=True)
    generator = subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), "generate", "clicks",
         "--count", "24000", "--rate", "2000", "--users", "800"],
        cwd=ROOT,
    )  # fmt: skip
    # checkpoints every 2 s: a micro-batch soon after a barrier carries none (its output waits)
    proc = cutline(home, "run", JOB, "--max-records-per-partition", "600", "--interval-ms", "2000")
    try:
        wait_for(lambda: len(checkpoints_so_far(home, JOB)) >= 2, 300, "2 checkpoints", proc)
        # the restore drill beside the live job: it reads, and the output stays exact (below)
        drill = restore_drill(get_job(JOB), paths)
        assert drill.rows["count_by_user/aggregates"] > 0 and drill.bytes_read > 0
        first = savepoint(home, "--target", str(tmp_path / "saved"))
        # all input read, no micro-batch runs: a savepoint of the latest committed checkpoint
        assert generator.wait(timeout=300) == 0
        wait_for(lambda: idle_for(home, 4.0), 300, "the job idle", proc)
        barriers = idle_barrier_after_staged_output(home, proc)
        wait_for(lambda: idle_for(home, 4.0), 300, "the job idle again", proc)
        # idle, and running: every click is in committed output (what the last micro-batch
        # staged after its barrier committed at a barrier with no records, within the interval)
        report(f"idle, before any stop, after {barriers}: {check(JOB, home)}")
        idle = savepoint(home, "--target", str(tmp_path / "saved"), "--timeout", "60")
        assert idle["batch_id"] == max(job_cuts(home, [JOB]).epochs)
        stopped = savepoint(home, "--target", str(tmp_path / "saved"), "--stop")
        assert finish(proc, 120) == 0, (home / "driver.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            kill_driver(proc)
    assert first["status"] == idle["status"] == stopped["status"] == "COMPLETED"
    assert first["batch_id"] < stopped["batch_id"] and stopped["stopped"]
    assert "savepoint while idle" in (home / "driver.log").read_text()
    reader = CatalogReader(paths.catalog)
    assert reader.jobs(JOB)[-1]["status"] == "FINISHED"
    # stop-with-savepoint: the output is committed through the savepoint, nothing left staged
    assert max(job_cuts(home, [JOB]).epochs) == stopped["batch_id"]
    assert not [f for f in (home / "warehouse" / "staging").rglob("*") if f.is_file()]
    assert [r["location"] for r in reader.savepoints(JOB)] == [
        first["location"],
        idle["location"],
        stopped["location"],
    ]

    # the job's GC takes what its checkpoints no longer need, and nothing of the savepoints
    before = {r["location"]: read_savepoint(open_storage(r["location"])) for r in (first, stopped)}
    gc = command(home, "gc", JOB, "--grace-s", "0", "--json")
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout)["files_deleted"] > 0
    for location, manifest in before.items():
        assert read_savepoint(open_storage(location)) == manifest  # every checksum again

    # the first moves to another bucket, the original deleted: another job restores it there
    bucket = f"moved-{uuid.uuid4().hex[:12]}"
    moved = S3Storage(bucket, "team/savepoints/sp-1", endpoint_url=s3_server)
    moved._client.create_bucket(Bucket=bucket)
    copy_tree(open_storage(first["location"]), moved)
    gone = command(home, "savepoint", JOB, "--dispose", first["location"])
    assert gone.returncode == 0, gone.stderr
    run_to_end(
        home,
        "run",
        "tests.savepoint_jobs:clicks_copy",
        "--restore",
        moved.url,
        "--until-caught-up",
        "--max-records-per-partition",
        "1500",
        env={"AWS_ENDPOINT_URL_S3": s3_server},
    )
    report(check_from_savepoint(home, "clicks_copy", first["batch_id"]))
    assert [r["status"] for r in reader.savepoints(JOB)] == ["DELETED", "COMPLETED", "COMPLETED"]

    # the second moves to another directory; the job itself restores it and reads new input:
    # the counts it emits go on from the savepoint's state
    elsewhere = LocalFileStorage(tmp_path / "elsewhere" / "sp-2")
    copy_tree(open_storage(stopped["location"]), elsewhere)
    rows_before = len(output(home, JOB))
    generate(home / "log", "clicks", "clicks", count=3_000, seed=11, users=800)
    run_to_end(home, "run", JOB, "--restore", str(elsewhere.root), "--until-caught-up")
    assert max(job_cuts(home, [JOB]).epochs) > stopped["batch_id"], "epochs after the savepoint"
    assert len(output(home, JOB)) > rows_before
    report(f"restored from the moved stop savepoint, then new input: {check(JOB, home)}")


IDLE_BARRIER = re.compile(r"idle: checkpoint (\d+), a barrier with no records, commits the output")


def idle_barrier_after_staged_output(home, proc, tries: int = 3) -> str:
    """Make the running job stage output after a barrier and go idle, and wait for the barrier
    with no records that commits it: a few new clicks (their micro-batch takes a barrier, the
    interval having passed), then, once that checkpoint completes, a few more at once (their
    micro-batch comes within the interval: no barrier, output staged). Returns what fired."""
    log = home / "driver.log"
    for attempt in range(tries):
        since = log.stat().st_size
        count = len(checkpoints_so_far(home, JOB))
        generate(home / "log", "clicks", "clicks", count=200, seed=20 + attempt, users=800)
        wait_for(lambda n=count: len(checkpoints_so_far(home, JOB)) > n, 120, "a checkpoint", proc)
        generate(home / "log", "clicks", "clicks", count=200, seed=40 + attempt, users=800)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            fired = IDLE_BARRIER.findall(log.read_bytes()[since:].decode(errors="replace"))
            if fired:
                return f"the idle barrier of checkpoint {fired[-1]}"
            time.sleep(0.5)
    raise AssertionError(f"no barrier with no records in {tries} tries: {log.read_text()[-3000:]}")


def idle_for(home, seconds: float) -> bool:
    """Whether the job's driver log has not grown for ``seconds``: no micro-batch ran."""
    log = home / "driver.log"
    return time.time() - log.stat().st_mtime > seconds


def check_from_savepoint(home, table: str, batch_id: int, values: tuple = ()) -> str:
    """``table``'s output (a job restored from a savepoint of clicks per user at epoch
    ``batch_id``) is exactly the reference's rows of the epochs after it, computed from the
    whole input: the state the savepoint held counts every click before it. ``values``: the
    columns compared (default: the reference's)."""
    cuts = job_cuts(home, [table])
    assert min(cuts.epochs) == batch_id  # its first commit records the savepoint's cut
    inputs = {"clicks": cuts.assign(read_log(home, "clicks"), "clicks")}
    expected = expect_clicks_per_user(inputs, cuts.epochs)["clicks_per_user"]
    after = expected.rows[expected.rows[EPOCH] > batch_id]
    assert len(after) > 0
    compared = list(values) or expected.values
    return compare_rows(output(home, table), after, expected.keys, compared, table)


@pytest.mark.slow
@pytest.mark.landing
@pytest.mark.spark
def test_a_savepoint_written_from_a_dataframe_starts_a_job_that_continues_it(tmp_path, spark):
    """A migration: another system counted the first part of every partition of the log. Its
    counts, as a Spark DataFrame, become a savepoint of clicks_counted at that cut; the job
    started from it counts on from there, exactly as pandas counts the whole log."""
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=12_000, seed=5, users=600)
    clicks = read_log(home, "clicks")
    cut = {  # the position of a record: it and those after it are the job's to read
        str(p): int(rows["offset"].sort_values().iloc[len(rows) * 2 // 5])
        for p, rows in clicks.groupby("partition")
    }
    counted = before_cut(clicks, cut).groupby("user").size()
    frame = spark.createDataFrame(
        pd.DataFrame({"user": counted.index, "value": counted.to_numpy().astype("int64")})
    )
    job = "tests.savepoint_jobs:clicks_counted"
    location = write_savepoint(
        job,
        {("count_clicks", "clicks"): frame},
        str(tmp_path / "migrated"),
        positions={"clicks": cut},
        home=str(home),
    )
    run_to_end(
        home, "run", job, "--restore", location, "--until-caught-up",
        "--max-records-per-partition", "1000",
    )  # fmt: skip
    report(check_from_savepoint(home, "clicks_counted", 0, values=("clicks",)))


def sessionized(clicks: pd.DataFrame, gap: int) -> pd.DataFrame:
    """Sessions computed by pandas alone: a gap of ``gap`` or more between a user's clicks
    ends one; numbered per user from 1."""
    df = clicks.sort_values(["user", "ts"], kind="stable")
    new = (df.user != df.user.shift()) | (df.ts.diff() >= gap)
    df = df.assign(session=new.cumsum())
    out = df.groupby("session").agg(
        user=("user", "first"), session_start=("ts", "min"), session_end=("ts", "max"),
        clicks=("ts", "size"), pages=("url", "nunique"),
    )  # fmt: skip
    out = out.sort_values(["user", "session_start"]).reset_index(drop=True)
    return out.assign(session_no=out.groupby("user").cumcount() + 1)


@pytest.mark.slow
@pytest.mark.spark
def test_a_bootstrapped_sessions_job_closes_the_sessions_it_took_over_by_their_timers(
    tmp_path, spark
):
    """Another system's sessionization handed over: its open sessions' clicks (the two list
    states) and a timer per click (event time plus the gap), as Spark DataFrames, become a
    savepoint of ``sessions``. The log holds only other users' later clicks: their watermark
    fires the handed-over timers, so every handed-over session closes with no record of its
    user read. The output holds them as pandas sessionizes the handed-over clicks, each once,
    and only sessions pandas computes from the new clicks; no handed-over timer is left."""
    from cutline.sources.log_format import append_records
    from spark_jobs.commands.state_read import load_timers
    from spark_jobs.state_processor import read_timers

    gap, t0 = 10_000, 1_767_225_600_000
    rng = np.random.default_rng(3)
    old = pd.DataFrame({
        "user": [f"old-{u}" for u in rng.integers(0, 60, 1_500)],
        "url": [f"/p/{p}" for p in rng.integers(0, 20, 1_500)],
        "ts": np.sort(rng.integers(t0, t0 + 600_000, 1_500)),
    })  # fmt: skip
    home = tmp_path / "home"
    new_parts = []
    for partition in (0, 1):  # later than every handed-over click by more than gap and lateness
        n = 800
        part = pd.DataFrame({
            "user": [f"new-{u}" for u in rng.integers(0, 30, n)],
            "url": [f"/p/{p}" for p in rng.integers(0, 20, n)],
            "ts": t0 + 700_000 + 50 * np.arange(n) + partition,
        })  # fmt: skip
        lines = [json.dumps(r).encode() for r in part.to_dict("records")]
        append_records(home / "log", "clicks", partition, lines)
        new_parts.append(part)
    new = pd.concat(new_parts, ignore_index=True)

    ordered = old.sort_values(["user", "ts"], kind="stable")
    index = ordered.groupby("user").cumcount()
    times = ordered.assign(list_index=index)[["user", "ts", "list_index"]]
    pages = ordered.assign(list_index=index)[["user", "url", "list_index"]]
    timers = ordered.assign(timestamp=ordered.ts + gap, domain="event")
    location = write_savepoint(
        "sessions",
        {
            ("sessionize", "times"): spark.createDataFrame(
                times.rename(columns={"ts": "list_element"})
            ),
            ("sessionize", "pages"): spark.createDataFrame(
                pages.rename(columns={"url": "list_element"})
            ),
        },
        str(tmp_path / "handed-over"),
        home=str(home),
        timers={"sessionize": spark.createDataFrame(
            timers[["user", "timestamp", "domain"]].drop_duplicates()
        )},
    )  # fmt: skip
    handed = read_timers(spark, "sessions", "sessionize", location, home=str(home)).toPandas()
    assert len(handed) == len(timers[["user", "timestamp"]].drop_duplicates())
    run_to_end(
        home, "run", "sessions", "--restore", location, "--until-caught-up",
        "--max-records-per-partition", "200",
    )  # fmt: skip
    got = output(home, "sessions")
    columns = ["user", "session_start", "session_end", "clicks", "pages", "session_no"]
    got_old = got[got.user.str.startswith("old-")][columns]
    got_old = got_old.sort_values(["user", "session_start"]).reset_index(drop=True)
    expected_old = sessionized(old, gap)[columns]
    pd.testing.assert_frame_equal(got_old, expected_old, check_dtype=False)
    got_new = got[got.user.str.startswith("new-")][columns]
    assert not got_new.duplicated(["user", "session_start"]).any()
    pandas_new = {tuple(r) for r in sessionized(new, gap)[columns].itertuples(index=False)}
    assert {tuple(r) for r in got_new.itertuples(index=False)} <= pandas_new
    left = load_timers(get_job("sessions"), "sessionize", RuntimePaths.under(home))
    assert all(u.startswith("new-") for u in left.column("user").to_pylist())
    report(
        f"bootstrapped sessions: {len(got_old)} handed-over sessions closed by their timers "
        f"(equal to pandas), {len(got_new)} new ones; {left.num_rows} timers left, all new users'"
    )
