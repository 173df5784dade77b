"""Retention GC against a real job: GC runs over and over while the job checkpoints, is killed
and restored; primary storage stays bounded, every retained checkpoint stays restorable, the
output stays exact, and ``shared_state_files`` tells the truth about what is stored."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path
from subprocess import Popen

import pytest
from dagster import instance_for_test
from deltalake import DeltaTable

from orchestration.definitions import defs
from orchestration.resources import CutlinePaths
from spark_jobs.catalog.shared_files import SUMMARY
from spark_jobs.catalog.tables import TABLES, CatalogReader
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.errors import ConfigurationError
from spark_jobs.job_loader import get_job
from spark_jobs.maintenance.gc import (
    FAULT_PAUSE,
    FAULT_PAUSED,
    FAULT_PLAN_DELAY_S,
    FAULT_PLAN_GATE,
    collect_garbage,
)
from spark_jobs.sources.generate import generate
from state.catalog import CheckpointStatus
from state.compaction import read_request
from state.paths import JobLayout
from state.restore import read_manifest
from state.storage import open_storage
from tests import tiers
from tests.e2e_util import (
    checkpoints_so_far,
    completed_checkpoints,
    cutline,
    finish,
    gc_left_only_what_is_needed,
    kill_driver,
    report,
    run_to_end,
    verify_retained,
    wait_for,
)
from tests.reference import check

pytestmark = [pytest.mark.slow, pytest.mark.spark]

JOB = "clicks_per_user"
IDLE = "8"


def make_home(base: Path, name: str) -> Path:
    home = base / name
    generate(home / "log", "clicks", "clicks", count=200_000, seed=7, users=20_000)
    return home


GRACE_S = 4.0


def listed_root(paths: RuntimePaths) -> list:
    """What the job's root holds now (one listing, for :func:`settled_bytes` and
    :func:`protected_bytes`)."""
    return list(open_storage(paths.checkpoint_root).list(JOB))


def settled_bytes(listed: list, since_s: float) -> int:
    """Bytes of ``listed`` older than ``since_s`` (outside the grace window, whose uploads may
    belong to pending checkpoints)."""
    return sum(i.size for i in listed if i.modified < since_s and "/_acks/" not in i.path)


def protected_bytes(paths: RuntimePaths, listed: list, protected: list[int]) -> int:
    """The bound of what a pass leaves: what the checkpoints it protected hold (the retained
    ones, those subsumed within the grace period, the one the attempt restored from; which
    ones: tests/test_gc_plan.py), their full sizes and their own manifests and claims (found in
    ``listed``) added up. Not (num_retained + 1) x the largest retained one: a compaction
    shrinks the state, and the checkpoint just subsumed, or restored from, can be several times
    the retained ones."""
    sizes = {r.checkpoint_id: r.full_size for r in CatalogReader(paths.catalog).checkpoints(JOB)}
    layout = JobLayout(JOB)
    own = {layout.job_path(f(c)) for c in protected for f in (layout.metadata, layout.claim)}
    return sum(sizes[c] for c in protected) + sum(i.size for i in listed if i.path in own)


def test_gc_while_the_job_runs_and_restores_keeps_storage_bounded_and_output_exact(spark, tmp_path):
    home = make_home(tmp_path, "home")
    paths = RuntimePaths.under(home)
    passes, deleted, worst = 0, 0, 0.0

    history = []
    measure = False  # the slowed-down first attempt has checkpoints pending beyond the grace

    def gc_pass() -> None:  # GC "on a schedule": every 2 s
        nonlocal passes, deleted, worst
        time.sleep(2)
        started = time.time()
        report = collect_garbage(JOB, paths, grace_s=GRACE_S, log=lambda *_: None)
        passes += 1
        deleted += report.files_deleted
        listed = listed_root(paths)
        old = settled_bytes(listed, started - GRACE_S)
        limit = protected_bytes(paths, listed, report.protected)
        history.append((old, limit, report.stored_bytes, report.retained, report.protected))
        if measure:
            worst = max(worst, old / limit)

    # uploads slowed down: checkpoints stay pending for a while, with their files in storage
    slow = {"CUTLINE_FAULT_UPLOAD_DELAY_S": "2"}
    # in small micro-batches: it must still run when its fourth checkpoint completes
    small = ["--max-records-per-partition", "8000"]
    proc = cutline(home, "run", JOB, "--idle-timeout", IDLE, *small, env=slow)
    wait_for(lambda: checkpoints_so_far(home, JOB), 300, "a first checkpoint", proc)
    while len(completed_checkpoints(home, JOB)) < 4:
        assert proc.poll() is None, "the first attempt ended before it was killed"
        gc_pass()
    kill_driver(proc)
    gc_pass()  # while nothing runs: the killed attempt still says RUNNING
    verify_retained(paths, JOB)

    proc = cutline(home, "run", JOB, "--idle-timeout", IDLE)  # restores, runs to the end
    measure = True
    while proc.poll() is None:
        gc_pass()
    assert proc.returncode == 0, (home / "driver.log").read_text()[-3000:]
    time.sleep(GRACE_S)
    gc_pass()
    report(f"\n{passes} GC passes, {deleted} files deleted; settled/bound at worst {worst:.2f}")
    assert deleted > 0 and worst <= 1.0, history
    assert all(len(retained) <= get_job(JOB).checkpoint.num_retained for *_, retained, _ in history)
    retained = verify_retained(paths, JOB)
    assert len(retained) == get_job(JOB).checkpoint.num_retained
    report(check("clicks_per_user", home))

    # the registry tells the truth: LIVE rows are exactly the stored shared files
    storage = open_storage(paths.checkpoint_root)
    stored = {i.path[len(JOB) + 1 :] for i in storage.list(JOB) if "/shared/" in "/" + i.path}
    rows = CatalogReader(paths.catalog).shared_files(JOB)
    assert {r["path"] for r in rows if r["status"] == "LIVE"} == stored
    assert all(r["deleted_at_ms"] for r in rows if r["status"] == "DELETED")
    latest = read_manifest(storage, CatalogReader(paths.catalog).checkpoints(JOB)[-1].metadata_path)
    for r in rows:
        if r["path"] in latest.shared_paths():
            assert r["refcount"] >= 1 and r["last_used"] == latest.checkpoint_id

    # a later run restores the latest checkpoint after all that GC
    run_to_end(home, "run", JOB, "--until-caught-up")
    report(check("clicks_per_user", home))


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A home where clicks_per_user ran to the end, checkpointing every 0.5 s."""
    home = make_home(tmp_path_factory.mktemp("finished"), "home")
    run_to_end(home, "run", JOB, "--until-caught-up", "--interval-ms", "500")
    return home


def test_compaction_job_compacts_the_catalog_and_requests_state_compaction(spark, finished):
    home = finished
    paths = RuntimePaths.under(home)
    reader = CatalogReader(paths.catalog)
    before = {t: len(DeltaTable(reader.path(t)).file_uris()) for t in TABLES}
    checkpoints = reader.checkpoints(JOB)
    assert len(checkpoints) > 3 and sum(before.values()) > len(TABLES)  # files of many commits

    with instance_for_test() as instance:
        result = defs.get_job_def("compaction_job").execute_in_process(
            instance=instance,
            run_config={"ops": {"request_state_compaction": {"config": {"force": True}}}},
            resources={"cutline_paths": CutlinePaths(home=str(home))},
        )
    assert result.success
    out = {
        e.step_key: {k: v.value for k, v in e.event_specific_data.metadata.items()}
        for e in result.all_events
        if e.event_type_value == "STEP_OUTPUT"
    }
    after = {t: len(DeltaTable(reader.path(t)).file_uris()) for t in TABLES}
    assert all(after[t] <= before[t] for t in TABLES) and sum(after.values()) < sum(before.values())
    # the job's checkpoint history in one file, its retained checkpoints in another: the
    # subsume of each later checkpoint rewrites the second only (spark_jobs/catalog/upkeep.py)
    assert after["completed_checkpoints"] == 2
    assert out["compact_catalog"] == {f"{t}_files": n for t, n in after.items()}
    for t in TABLES:  # a log checkpoint: readers no longer replay every commit
        assert list(Path(reader.path(t), "_delta_log").glob("*.checkpoint*.parquet")), t
    assert reader.checkpoints(JOB) == checkpoints  # same rows, fewer files

    assert out["request_state_compaction"] == {"requested": {JOB: [0, 1]}}
    request = read_request(open_storage(paths.checkpoint_root), JobLayout(JOB))
    assert request is not None and request.subtasks == (0, 1)
    assert request.based_on == checkpoints[-1].checkpoint_id


def test_gc_given_another_root_than_the_jobs_refuses_naming_both(finished, tmp_path):
    """A schedule run with the deployment's root over a job whose run config put its
    checkpoints elsewhere: GC says so before it lists or marks anything."""
    home = finished
    elsewhere = tmp_path / "elsewhere"
    stray = elsewhere / JOB / "shared" / "0" / "000001.sst"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"state")
    paths = dataclasses.replace(RuntimePaths.under(home), checkpoint_root=str(elsewhere))
    with pytest.raises(ConfigurationError, match="was written under the checkpoint root"):
        collect_garbage(JOB, paths, grace_s=0, log=lambda *_: None)
    assert stray.read_bytes() == b"state"


def test_dry_run_deletes_nothing_and_the_dagster_job_reports_what_it_reclaimed(spark, finished):
    home = finished
    paths = RuntimePaths.under(home)
    storage = open_storage(paths.checkpoint_root)
    before = sorted(i.path for i in storage.list(JOB))
    dry = collect_garbage(JOB, paths, dry_run=True, grace_s=0, log=lambda *_: None)
    assert dry.files_deleted > 0
    assert sorted(i.path for i in storage.list(JOB)) == before
    # with an hour's grace the same files are kept, and the report says so (the job ran minutes
    # ago): how many, their bytes, and until when
    started = time.time() * 1000
    graced = collect_garbage(JOB, paths, dry_run=True, grace_s=3600, log=lambda *_: None)
    assert graced.files_deleted == 0
    assert (graced.grace_kept_files, graced.grace_kept_bytes) == (
        dry.files_deleted,
        dry.bytes_reclaimed,
    )
    assert started + 3600_000 <= graced.grace_until_ms <= time.time() * 1000 + 3600_000
    assert dry.grace_kept_files == 0

    with instance_for_test() as instance:
        result = defs.get_job_def("retention_job").execute_in_process(
            instance=instance,
            run_config={"ops": {"retention_gc": {"config": {"grace_s": 0.0}}}},
            resources={"cutline_paths": CutlinePaths(home=str(home))},
        )
    assert result.success
    (mat,) = [
        e.event_specific_data.materialization
        for e in result.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
    ]
    assert mat.partition == JOB
    assert mat.metadata["files_deleted"].value == dry.files_deleted
    assert mat.metadata["reclaimed_mib"].value == round(dry.bytes_reclaimed / 2**20, 3)
    assert len(list(storage.list(JOB))) == len(before) - dry.files_deleted
    verify_retained(paths, JOB)


# the points of a GC pass, in the order a pass reaches them
GC_POINTS = ("listed", "subsumed", "deleting", "deleting again", "deleted", "updating", "updated",
             "recorded")  # fmt: skip


def kill_points() -> list[tuple[str, float]]:
    """Points of a GC pass to kill it at (all of them in the whole tier, the landing tier's
    slice of the "gc kills" matrix otherwise), in the order a pass reaches them (so each kill
    finds work left), with how long after reaching it the kill comes."""
    rng = tiers.rng("gc kills")
    drawn = sorted(tiers.draw("gc kills", GC_POINTS), key=GC_POINTS.index)
    points = []
    for name in drawn:
        if name.startswith("deleting"):  # after 1 to 5 deletions
            points.append((f"deleting:{rng.randint(1, 5)}", 0.0))
        elif name == "updating":  # inside the registry rewrite (a 3 s plan)
            points.append((name, rng.uniform(0.0, 2.0)))
        else:
            points.append((name, 0.0))
    return points


@pytest.mark.landing  # with a slice of the kill points
def test_gc_killed_at_random_points_and_rerun_deletes_exactly_what_nothing_needs(tmp_path):
    points = kill_points()
    report(f"\nseed {tiers.SEED}: kill -9 at {points}")
    home = make_home(tmp_path, "home")
    paths = RuntimePaths.under(home)
    storage = open_storage(paths.checkpoint_root)
    fast = ("--until-caught-up", "--interval-ms", "300")  # many checkpoints, most subsumed
    run_to_end(home, "run", JOB, *fast)
    # a compaction at the next run's first barrier leaves every older shared file unreferenced
    run_to_end(home, "compact", JOB, "--force")
    generate(home / "log", "clicks", "clicks", count=100_000, seed=7, users=20_000)
    run_to_end(home, "run", JOB, *fast)
    # and orphans: an upload of a checkpoint that never completed, a file no manifest names
    storage.put_bytes(f"{JOB}/chk-9999/op/0/000009.sst.abc", b"x" * 100)
    storage.put_bytes(f"{JOB}/shared/op/0/000009-0123456789abcdef.sst", b"x" * 100)

    reader = CatalogReader(paths.catalog)
    subsumed = reader.checkpoints(JOB, (CheckpointStatus.SUBSUMED,))
    assert len(subsumed) >= 5, "the runs left subsumed checkpoints for GC to collect"
    gc_args = ("gc", JOB, "--grace-s", "0", "--json")
    for point, delay in points:
        marker = tmp_path / f"paused-{point}"
        env = {FAULT_PAUSE: point, FAULT_PAUSED: str(marker), FAULT_PLAN_DELAY_S: "3"}
        proc = cutline(home, *gc_args, env=env, log=tmp_path / "gc.log")
        wait_for(marker.exists, 180, f"GC to reach {point}", proc)
        time.sleep(delay)
        assert proc.poll() is None, f"the pass ended before its kill at {point}"
        kill_driver(proc)
        assert proc.returncode == -9, (point, proc.returncode)
        # what a kill leaves: every completed checkpoint restorable, the catalog readable,
        # and the rows of the files they need still LIVE
        verify_retained(paths, JOB)
        live = {r["path"] for r in reader.shared_files(JOB) if r["status"] == "LIVE"}
        for row in reader.checkpoints(JOB, (CheckpointStatus.COMPLETED,)):
            needed = read_manifest(storage, row.metadata_path).shared_paths()
            assert needed <= live | _unrecorded(reader, needed), (point, needed - live)

    run_to_end(home, *gc_args)
    # nothing unreferenced is left (grace 0, the job is not running), the registry says so ...
    kept = gc_left_only_what_is_needed(paths, JOB)
    assert len(kept) == get_job(JOB).checkpoint.num_retained
    # ... and the job restores its latest checkpoint and ends with exact output
    run_to_end(home, "run", JOB, "--until-caught-up")
    report(check("clicks_per_user", home))


def _unrecorded(reader: CatalogReader, paths: set[str]) -> set[str]:
    """Of ``paths``, those the registry has no row for at all (GC adds them on its next pass)."""
    known = {r["path"] for r in reader.shared_files(JOB)}
    return {p for p in paths if p not in known}


BESIDE_PASSES = 6


def test_gc_passes_back_to_back_beside_a_job_checkpointing_every_second_all_exit_0(tmp_path):
    """Retention beside a job that checkpoints every second with input arriving throughout:
    ``cutline gc`` passes back to back, and every one exits 0. The job registers each
    checkpoint's new shared files by appending to its partition of ``shared_state_files``;
    every pass's registry plan is held open until such an append has landed between its read
    and its commit, which a MERGE lost to until its retries ran out; the rewrite commits anyway,
    planned once. Storage stays bounded, the registry tells the truth once the job has
    ended and a pass has settled, and the output is exact."""
    began = time.monotonic()
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=40_000, seed=7, users=20_000)
    paths = RuntimePaths.under(home)
    stop = threading.Event()

    def feed() -> None:  # input arriving throughout, about 2,000 records a second
        while not stop.wait(0.2):
            generate(home / "log", "clicks", "clicks", count=200, seed=7, users=20_000)

    job = cutline(home, "run", JOB, "--interval-ms", "1000", "--idle-timeout", IDLE)
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    passes: list[dict] = []
    try:
        wait_for(lambda: len(checkpoints_so_far(home, JOB)) >= 2, 300, "checkpoints", job)
        first = len(completed_checkpoints(home, JOB))
        while len(passes) < BESIDE_PASSES:
            assert job.poll() is None, "the job ended before the GC passes beside it did"
            # the next pass once a checkpoint newer than the last pass's latest completed: every
            # pass has changes to commit (the latest checkpoint's refcounts and last use)
            passes.append(_cutline_gc(home, paths, f"beside-{len(passes)}", job))
            wait_for(lambda n=passes[-1]["latest"]: _latest(home) > n, 60, "a checkpoint", job)
        during = len(completed_checkpoints(home, JOB)) - first
    except BaseException:
        kill_driver(job)
        raise
    finally:
        stop.set()
        feeder.join()
    window = (passes[0]["started"], passes[-1]["started"] + passes[-1]["seconds"])
    assert finish(job, 300) == 0, (home / "driver.log").read_text()[-3000:]
    time.sleep(GRACE_S)
    settled = _cutline_gc(home, paths, "settled")

    history = DeltaTable(CatalogReader(paths.catalog).path("shared_state_files")).history()
    inside = [c for c in history if window[0] * 1000 <= c["timestamp"] <= window[1] * 1000]
    # the job's registry appends: every WRITE that is not a rewrite (delta-rs records no
    # isBlindAppend)
    rewrites = [c for c in inside if (c.get("userMetadata") or "").startswith(SUMMARY)]
    appends = sum(1 for c in inside if c.get("operation") == "WRITE" and c not in rewrites)
    # commits (the job's appends) between the version each rewrite was planned on and its own
    between = [
        c["version"] - c["readVersion"] - 1 for c in sorted(rewrites, key=lambda c: c["version"])
    ]
    report(
        f"\n{len(passes)} GC passes beside the job, exit codes {[p['rc'] for p in passes]}, "
        f"{[round(p['seconds'], 1) for p in passes]} s each (registry plan and commit "
        f"{[p['rewrite_ms'] for p in passes]} ms, held open until the job appended); "
        f"{during} checkpoints and {appends} registry appends by the job meanwhile, "
        f"{between} of them between a rewrite's read and its commit; registry re-plans "
        f"{[p['replans'] for p in passes]}, other catalog conflicts retried "
        f"{[p['retried'] for p in passes]}; settled/bound after each "
        f"{[round(p['ratio'], 2) for p in passes]}; settled pass {settled['seconds']:.1f} s"
    )
    every = [*passes, settled]
    assert [p["rc"] for p in every] == [0] * len(every), [p["log"] for p in every if p["rc"]]
    assert during >= len(passes) and appends > 0  # the job checkpointed and registered files
    # every rewrite had the job's appends land inside it, and none was planned again for them
    assert len(between) == len(passes) and all(between), between
    assert [p["replans"] for p in passes] == [0] * len(passes)
    assert max(p["ratio"] for p in every) <= 1.0, every
    assert sum(p["deleted"] for p in passes) > 0

    # the registry tells the truth: one row per file ever registered, LIVE ones exactly the
    # stored shared files, and the latest checkpoint's with their refcount and last use
    verify_retained(paths, JOB)
    storage = open_storage(paths.checkpoint_root)
    stored = {i.path[len(JOB) + 1 :] for i in storage.list(JOB) if "/shared/" in "/" + i.path}
    reader = CatalogReader(paths.catalog)
    rows = reader.shared_files(JOB)
    assert len(rows) == len({r["path"] for r in rows})
    assert {r["path"] for r in rows if r["status"] == "LIVE"} == stored
    assert all(r["deleted_at_ms"] for r in rows if r["status"] == "DELETED")
    latest = read_manifest(storage, reader.checkpoints(JOB)[-1].metadata_path)
    for r in rows:
        if r["path"] in latest.shared_paths():
            assert r["refcount"] >= 1 and r["last_used"] == latest.checkpoint_id
    report(check("clicks_per_user", home))
    report(f"wall time {time.monotonic() - began:.0f} s")


def _latest(home: Path) -> int:
    return max((r["checkpoint_id"] for r in checkpoints_so_far(home, JOB)), default=0)


def _cutline_gc(home: Path, paths: RuntimePaths, name: str, job: Popen | None = None) -> dict:
    """One ``cutline gc`` process run to its end: its exit code, duration and report, and the
    settled bytes over their bound as it leaves storage (measured when it reaches the registry
    update, having listed and deleted, so that what the job made garbage since is not counted).
    Beside a running ``job``, the pass's registry plan is held open until the job has appended
    to the registry after the plan read it."""
    log, marker = home / f"gc-{name}.log", home / f"gc-{name}.updating"
    gate = home / f"gc-{name}.gate"
    env = {FAULT_PAUSE: "updating", FAULT_PAUSED: str(marker)}  # a marker; the pass goes on
    if job is not None:
        env[FAULT_PLAN_GATE] = str(gate)
    started = time.time()
    proc = cutline(home, "gc", JOB, "--grace-s", str(GRACE_S), "--json", env=env, log=log)
    while not marker.exists() and proc.poll() is None:
        time.sleep(0.05)
    listed = listed_root(paths)  # the protected checkpoints' manifests stay through the pass
    old = settled_bytes(listed, started - GRACE_S)
    if job is not None:
        wait_for(Path(f"{gate}.planned").exists, 120, "the registry plan", proc)
        # loaded now: the plan read this version or an older one
        registry = DeltaTable(CatalogReader(paths.catalog).path("shared_state_files"))
        planned_on = registry.version()

        def appended() -> bool:
            registry.update_incremental()
            return registry.version() > planned_on

        try:
            wait_for(appended, 120, "the job's next registry append", job)
        except BaseException:
            kill_driver(proc)
            raise
        gate.touch()
    rc = finish(proc, 300)
    out = {"rc": rc, "started": started, "seconds": time.time() - started, "log": str(log)}
    if rc != 0:
        failed = {"latest": 0, "ratio": 0.0, "deleted": 0, "replans": 0, "retried": 0}
        return {**out, **failed, "rewrite_ms": 0}
    lines = log.read_text(errors="replace").splitlines()
    gc = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
    return {
        **out,
        "latest": max(gc["retained"]),
        "ratio": old / protected_bytes(paths, listed, gc["protected"]),
        "deleted": gc["files_deleted"],
        "replans": gc["registry_replans"],
        "retried": gc["conflicts_retried"],
        "rewrite_ms": gc["phase_ms"].get("update registry"),
    }


def test_gc_without_the_catalog_refuses_and_deletes_nothing(tmp_path):
    """A wrong warehouse would make every stored file look unreferenced: GC refuses instead."""
    paths = RuntimePaths.under(tmp_path)
    stored = Path(paths.checkpoint_root) / JOB / "shared" / "0" / "000001.sst"
    stored.parent.mkdir(parents=True)
    stored.write_bytes(b"state")
    with pytest.raises(ConfigurationError, match=r"no catalog under .*deletes nothing"):
        collect_garbage(JOB, paths, grace_s=0, log=lambda *_: None)
    assert stored.read_bytes() == b"state"
