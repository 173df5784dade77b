"""Task-local recovery across hosts, on a two-worker standalone cluster
(spark_jobs/deploy/standalone.py) whose workers are hosts 127.0.0.2 and 127.0.0.3, deployed as
on machines without a shared disk.

``clicks_per_user`` reads JSON files on the S3 server (the file source) and keeps every durable
role there (checkpoints, catalog, output, staged epochs); only the driver is told where S3 is
(``AWS_ENDPOINT_URL_S3``), the workers' environment does not say it, and the executors read,
upload, stage and download all the same (spark_jobs/deploy/session.py ``executor_env``). Each
process has a disk of its own that no other sees: each worker and its executors run in a mount
namespace where the other worker's directory and the driver's home are empty and read-only, and
the driver runs where neither worker's directory is (standalone.py ``private_view``), so a code
path that read or wrote another process's disk would fail the run.

The job runs with parallelism 4: every micro-batch task of a subtask must run on the host that
restored it (placement.py), or it fails on missing working state; a run that finishes shows that
Spark never moved one. Then the driver is killed (``kill -9``) and the restore, given the lost
attempt's allocation as hints, must put every subtask back on its host and restore it from the
local copy (after it was rescaled across the hosts, 2 -> 3 -> 1 -> 4 subtasks, killed at each);
or a host is lost, and its subtasks restore from the primary copy on the surviving host while the
survivor's restore locally. Either way the output is exact, the driver's home holds only its log
and scratch space, and each worker's local state root only subtasks it ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from deltalake.exceptions import TableNotFoundError

from spark_jobs.catalog.tables import read_delta
from spark_jobs.deploy.session import DRIVER_JIT
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.deploy.standalone import StandaloneCluster, can_hide
from state.storage.tables import table_uri
from tests.e2e_util import (
    active_driver,
    cutline,
    finish,
    kill_driver,
    report,
    run_to_end,
    wait_for,
)
from tests.file_input import clicks, put_file, read_files
from tests.file_jobs import FILES_ENV
from tests.reference import check

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.matrix("cluster")]

JOB = "tests.file_jobs:file_clicks"  # clicks_per_user on the file source
NAME = "file_clicks"
ARRIVING = "later/clicks-099.json"  # a file added while the job runs
HOSTS = ("127.0.0.2", "127.0.0.3")
# a first run spreads the subtasks over both hosts (later runs get the lost attempt's allocation)
SPREAD = {str(i): HOSTS[i % 2] for i in range(4)}


@dataclass
class Deployment:
    """The private cluster, the driver's home, and where everything durable is on S3."""

    cluster: StandaloneCluster
    home: Path
    files: str  # the job's input
    paths: RuntimePaths
    driver: dict  # how the driver starts: its own environment and private view

    @property
    def s3(self) -> tuple[str, ...]:
        return (
            "--checkpoint-root",
            self.paths.checkpoint_root,
            "--warehouse",
            self.paths.warehouse,
        )


@pytest.fixture
def deployment(s3_server, s3_bucket, tmp_path, monkeypatch) -> Iterator[Deployment]:
    """Two workers, each seeing neither the other's disk nor the driver's home; the input, 4
    files of 16,000 clicks, and every durable role on the S3 server, whose endpoint only the
    driver (and this process) is given."""
    if not can_hide():
        why = "no mount namespaces here (unshare --mount): private disks cannot be shown"
        if os.environ.get("CI"):  # a CI without them would pass without the cluster's proof
            pytest.fail(f"{why}; CI must run this test (give it CAP_SYS_ADMIN)", pytrace=False)
        pytest.skip(why)
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    assert not any(k.startswith("AWS_ENDPOINT_URL") for k in os.environ), "the workers' env"
    # the executors live a minute: the drivers' quick compiler starts them sooner (a
    # deployment's executors keep the JVM's default)
    cluster = StandaloneCluster(
        tmp_path / "cluster", HOSTS, private=True, hidden=(home,), java_options=" ".join(DRIVER_JIT)
    )
    with cluster:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)  # this process writes and reads S3
        files = f"s3://{s3_bucket}/files"
        monkeypatch.setenv(FILES_ENV, files)  # where the job's definition reads them from
        for n in range(4):
            put_file(files, f"clicks-{n:03d}.json", clicks(16_000, n))
        scratch = str(home / "tmp")  # the driver's Spark and Python scratch space, on its disk
        env = {"AWS_ENDPOINT_URL_S3": s3_server, "SPARK_LOCAL_DIRS": scratch, "TMPDIR": scratch}
        paths = RuntimePaths(f"s3://{s3_bucket}/chk", f"s3://{s3_bucket}/wh", "", "")
        yield Deployment(cluster, home, files, paths, {"env": env, "view": cluster.driver_view})


def run_args(
    d: Deployment, hints: dict[str, str], *extra: str, parallelism: int = 4
) -> tuple[str, ...]:
    hints_file = d.home / f"hints-{len(list(d.home.glob('hints-*')))}.json"
    hints_file.write_text(json.dumps(hints))
    return (
        "run", JOB, "--master", d.cluster.master_url, "--parallelism", str(parallelism),
        "--interval-ms", "1000", "--hints", str(hints_file), *d.s3, *extra,
    )  # fmt: skip


def catalog(d: Deployment, table: str) -> list[dict]:
    """The job's rows of a catalog table."""
    rows = read_delta(table_uri(d.paths.catalog, table), NAME).to_pylist()
    return [r for r in rows if r["job_id"] == NAME]


def latest_allocation(d: Deployment) -> dict[str, str]:
    attempts = sorted(catalog(d, "streaming_jobs"), key=lambda r: r["attempt"])
    return json.loads(attempts[-1]["allocation"])


def start_and_wait_for_checkpoints(d: Deployment, n: int) -> subprocess.Popen:
    """Start the job spread over both hosts; once ``n`` checkpoints completed, add a file and
    return once a checkpoint has read into it."""
    driver = cutline(d.home, *run_args(d, SPREAD, "--idle-timeout", "30"), **d.driver)
    wait_for(lambda: len(checkpoints(d)) >= n, 400, "checkpoints", driver)
    assert latest_allocation(d) == SPREAD, "the first run placed its subtasks as hinted"
    read_a_file_added_while_it_runs(d, driver, ARRIVING, seed=99)
    return driver


def checkpoints(d: Deployment) -> list[dict]:
    try:
        return catalog(d, "completed_checkpoints")
    except TableNotFoundError:
        return []


def read_a_file_added_while_it_runs(d: Deployment, driver, name: str, seed: int) -> None:
    """Add a file of 4,000 clicks (in a subdirectory) and return once a checkpoint has read
    into it: files arriving while the job runs are picked up."""
    put_file(d.files, name, clicks(4_000, seed))
    partition = str(zlib.crc32(name.encode()) & 0x7FFFFFFF)  # computed here, not by Cutline

    def read_the_new_file() -> bool:
        latest = max(checkpoints(d), key=lambda r: r["checkpoint_id"])
        return int(json.loads(latest["source_positions"])["clicks"].get(partition, 0)) > 0

    wait_for(read_the_new_file, 120, f"a checkpoint reading {name}, added while it ran", driver)


def restore_to_end(d: Deployment, *extra: str) -> None:
    """Restore with the lost attempt's allocation as hints and run to the end of the input."""
    args = run_args(d, latest_allocation(d), "--until-caught-up", *extra)
    run_to_end(d.home, *args, timeout=900, **d.driver)


def nothing_crossed_a_disk(d: Deployment, held: dict[str, set[int]], only: bool = False) -> None:
    """The driver's home holds its log, hints and scratch space alone (no catalog, output,
    staged epoch or local state), and each worker's local state root the subtasks ``held``
    (with ``only``: none but those)."""
    kept = sorted(p.name for p in d.home.iterdir() if not p.name.startswith("hints-"))
    assert kept == ["driver.log", "tmp"], kept
    found = {
        host: {int(p.name) for p in (d.cluster.workers[host].local_state_root / NAME).glob("*/*")}
        for host in HOSTS
    }  # <local state root>/<job>/<operator>/<subtask>
    if only:
        assert all(found[h] <= held[h] for h in HOSTS), (found, held)
    else:
        assert found == held, found


def output_is_exact(d: Deployment) -> None:
    report(check(NAME, d.home, d.paths.output, lambda _: read_files(d.files)))


def test_host_lost_restores_its_subtasks_remotely_and_the_others_locally(deployment):
    d = deployment
    driver = start_and_wait_for_checkpoints(d, 3)
    lost = HOSTS[1]
    d.cluster.kill_host(lost)
    assert driver.wait(timeout=300) != 0, "the attempt failed with its host"
    log = (d.home / "driver.log").read_text(errors="replace")
    allocation = latest_allocation(d)
    restore_to_end(d, "--executor-wait-s", "5")

    recovery = catalog(d, "recoveries")[-1]
    placement = {p["subtask"]: p for p in json.loads(recovery["placement"])}
    report(f"host lost: restore placement {placement}")
    on_lost = {int(s) for s, h in allocation.items() if h == lost}
    assert on_lost, log[-3000:]
    for subtask, p in placement.items():
        assert p["host"] == HOSTS[0]
        assert p["source"] == ("remote" if subtask in on_lost else "local"), p
    assert recovery["subtasks_remote"] == len(on_lost)
    assert recovery["subtasks_local"] == 4 - len(on_lost)
    nothing_crossed_a_disk(d, {lost: on_lost, HOSTS[0]: {0, 1, 2, 3}})
    output_is_exact(d)


def test_rescaled_2_3_1_4_across_hosts_then_a_kill_restores_every_subtask_locally(deployment):
    """At parallelism 2, killed; restored at 3, killed; at 1, killed; at 4, killed: each attempt
    checkpoints a file added while it runs before it is killed, so every restore rescales a
    checkpoint of the one before, each new subtask built from the old ones overlapping it on the
    host it is placed on. Then a restore at 4 again, given the lost attempt's allocation as
    hints, puts every subtask back on its host, restores it from its local copy and runs to the
    end. The output is exact; no process read or wrote another's disk."""
    d = deployment
    args = run_args(d, {"0": HOSTS[0], "1": HOSTS[1]}, "--idle-timeout", "30", parallelism=2)
    driver = cutline(d.home, *args, **d.driver)
    wait_for(lambda: len(checkpoints(d)) >= 2, 400, "checkpoints", driver)
    for step, parallelism in enumerate((3, 1, 4)):
        kill_driver(driver)
        args = run_args(d, latest_allocation(d), "--idle-timeout", "30", parallelism=parallelism)
        driver = cutline(d.home, *args, **d.driver)
        read_a_file_added_while_it_runs(d, driver, f"later/rescale-{step}.json", seed=200 + step)
    kill_driver(driver)
    allocation = latest_allocation(d)
    restore_to_end(d)  # at parallelism 4 again

    recoveries = sorted(catalog(d, "recoveries"), key=lambda r: r["attempt"])
    rescaled = []
    for recovery in recoveries:
        placement = json.loads(recovery["placement"])
        sources = sorted({i for p in placement for i in p.get("rescaled_from", [])})
        joined = sorted({p["joined"] for p in placement if len(p.get("rescaled_from", [])) > 1})
        rescaled.append((len({p["subtask"] for p in placement}), len(sources), joined))
    report(f"\nrestores on the cluster (new parallelism, old subtasks read, joined by): {rescaled}")
    # a subtask built from several old ones joins their files: every checkpoint here is of a
    # first attempt or taken after a rescaled attempt's first-barrier compaction
    assert rescaled == [(3, 2, ["files"]), (1, 3, ["files"]), (4, 1, []), (4, 0, [])]
    last = recoveries[-1]
    placement = json.loads(last["placement"])
    local = last["subtasks_local"] / len(placement)
    report(f"driver kill: {local:.0%} of subtasks restored from local copies: {placement}")
    assert local >= 0.95 and last["bytes_remote"] == 0
    assert all(p["host"] == p["hint"] == allocation[str(p["subtask"])] for p in placement)
    ran: dict[str, set[int]] = {h: set() for h in HOSTS}  # every subtask each host ever ran
    for attempt in catalog(d, "streaming_jobs"):
        for subtask, host in json.loads(attempt["allocation"] or "{}").items():
            ran[host].add(int(subtask))
    nothing_crossed_a_disk(d, ran, only=True)
    output_is_exact(d)


def test_a_standby_takes_over_on_the_cluster_and_restores_every_subtask_locally(deployment):
    """``--standby`` on the cluster: the active driver's application holds the workers' cores,
    so the standby's session waits with no executor (it warms none). The active driver is
    killed (its JVM too): the workers stop its executors, the master gives the freed cores on
    the same hosts to the standby's application, and the takeover, placed as the lost attempt
    was, restores every subtask from its local copy, reads a file added after it and runs to
    its end. The output is exact; no process read or wrote another's disk."""
    d = deployment
    env = {**d.driver["env"], "CUTLINE_EVENTS": "stdout"}  # the supervisor's events
    args = run_args(d, SPREAD, "--idle-timeout", "20", "--standby")
    driver = cutline(d.home, *args, env=env, view=d.driver["view"])
    log = d.home / "driver.log"
    wait_for(lambda: len(checkpoints(d)) >= 2, 400, "checkpoints", driver)
    wait_for(lambda: "warm, waiting" in log.read_text(errors="replace"), 300, "a standby", driver)
    allocation = latest_allocation(d)
    killed = time.monotonic()
    os.killpg(active_driver(log.read_text(errors="replace")), signal.SIGKILL)
    read_a_file_added_while_it_runs(d, driver, "later/after-takeover.json", seed=300)
    seconds = time.monotonic() - killed
    report(f"standby on the cluster: kill -9 -> a checkpoint past a new file: {seconds:.1f} s")
    assert finish(driver, timeout=600) == 0, log.read_text(errors="replace")[-4000:]

    attempts = sorted(catalog(d, "streaming_jobs"), key=lambda r: r["attempt"])
    assert [(a["attempt"], a["status"]) for a in attempts] == [(1, "LOST"), (2, "FINISHED")]
    (recovery,) = [r for r in catalog(d, "recoveries") if r["attempt"] == 2]
    placement = json.loads(recovery["placement"])
    report(f"standby on the cluster: takeover placement {placement}")
    assert recovery["subtasks_local"] == 4 and recovery["bytes_remote"] == 0
    assert all(p["host"] == allocation[str(p["subtask"])] for p in placement)
    nothing_crossed_a_disk(d, {h: {s for s in range(4) if SPREAD[str(s)] == h} for h in HOSTS})
    output_is_exact(d)
