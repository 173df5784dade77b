"""Task-local recovery across hosts, on a two-worker standalone cluster
(spark_jobs/deploy/standalone.py)
whose workers are hosts 127.0.0.2 and 127.0.0.3, each with its own local state root.

``clicks_per_user`` runs with parallelism 4: every micro-batch task of a subtask must run on the
host that restored it (placement.py), or it fails on missing working state; a run that finishes
shows that Spark never moved one. Then the driver is killed (``kill -9``) and the restore, given
the lost attempt's allocation as hints, must put every subtask back on its host and restore it
from the local copy; or a host is lost, and its subtasks restore from the primary copy on the
surviving host while the survivor's restore locally. Either way the output is exact.

The host-lost run is a deployment without a shared disk: ``clicks_per_user`` reads JSON files on
the S3 server (the file source) and keeps every durable role there (checkpoints, catalog, output,
staged epochs); only the driver is told where S3 is (``AWS_ENDPOINT_URL_S3``), the workers'
environment does not say it, and the executors read, upload, stage and download all the same
(spark_jobs/deploy/session.py ``executor_env``). Each process has a disk of its own that no other
sees: each worker and its executors run in a mount namespace where the other worker's directory
and the driver's home are empty and read-only, and the driver runs where neither worker's
directory is (spark_jobs/deploy/standalone.py ``private_view``), so a code path that read or wrote
another process's disk would fail the run. Afterwards the driver's home holds only its log and
scratch space, and each worker's local state root only its own subtasks."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from deltalake.exceptions import TableNotFoundError

from spark_jobs.catalog.tables import read_delta
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.deploy.standalone import StandaloneCluster, can_hide
from spark_jobs.job_loader import job_name_of
from spark_jobs.sources.generate import generate
from state.storage.tables import table_uri
from tests.e2e_util import (
    cutline,
    kill_driver,
    report,
    run_to_end,
    wait_for,
)
from tests.file_input import clicks, put_file, read_files
from tests.file_jobs import FILES_ENV
from tests.reference import check

pytestmark = [pytest.mark.slow, pytest.mark.spark]

JOB = "clicks_per_user"
FILE_JOB = "tests.file_jobs:file_clicks"  # clicks_per_user on the file source
HOSTS = ("127.0.0.2", "127.0.0.3")
# a first run spreads the subtasks over both hosts (later runs get the lost attempt's allocation)
SPREAD = {str(i): HOSTS[i % 2] for i in range(4)}


@pytest.fixture
def cluster(tmp_path):
    with StandaloneCluster(tmp_path / "cluster", hosts=HOSTS) as c:
        yield c


@pytest.fixture
def private_cluster(tmp_path):
    """The two workers, each seeing neither the other's disk nor the driver's home."""
    if not can_hide():
        pytest.skip("no mount namespaces here (unshare --mount): private disks cannot be shown")
    home = tmp_path / "home"
    home.mkdir()
    hosts = {"hosts": HOSTS, "private": True, "hidden": (home,)}
    with StandaloneCluster(tmp_path / "cluster", **hosts) as c:
        yield c


def job_args(
    cluster: StandaloneCluster, home: Path, hints: dict[str, str], *extra: str, job: str = JOB
):
    hints_file = home / f"hints-{len(list(home.glob('hints-*')))}.json"
    hints_file.write_text(json.dumps(hints))
    return (
        "run", job, "--master", cluster.master_url, "--parallelism", "4",
        "--interval-ms", "1000", "--hints", str(hints_file), *extra,
    )  # fmt: skip


def catalog(home: Path, table: str, root: str | None = None, job: str = JOB) -> list[dict]:
    """The job's rows of a catalog table (under ``root``, default the home's)."""
    uri = table_uri(root or str(home / "warehouse" / "catalog"), table)
    return [r for r in read_delta(uri, job).to_pylist() if r["job_id"] == job]


def latest_allocation(home: Path, root: str | None = None, job: str = JOB) -> dict[str, str]:
    attempts = sorted(catalog(home, "streaming_jobs", root, job), key=lambda r: r["attempt"])
    return json.loads(attempts[-1]["allocation"])


def start_and_wait_for_checkpoints(
    cluster: StandaloneCluster, home: Path, n: int, *extra: str, job: str = JOB, **where
) -> subprocess.Popen:
    """Start ``job`` spread over both hosts; return once ``n`` checkpoints completed. ``where``:
    the driver's ``env`` and ``view``, and the ``catalog_root`` to read (default: the home's)."""
    root = where.pop("catalog_root", None)
    name = job_name_of(job)
    args = job_args(cluster, home, SPREAD, "--idle-timeout", "30", *extra, job=job)
    driver = cutline(home, *args, **where)

    def checkpoints() -> int:
        try:
            return len(catalog(home, "completed_checkpoints", root, name))
        except TableNotFoundError:
            return 0

    wait_for(lambda: checkpoints() >= n, 400, "checkpoints", driver)
    first = latest_allocation(home, root, name)
    assert first == SPREAD, "the first run placed its subtasks as hinted"
    return driver


def test_driver_killed_restores_every_subtask_locally_on_its_host(cluster, tmp_path):
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=100_000, seed=7, users=20_000)
    driver = start_and_wait_for_checkpoints(cluster, home, 3)
    kill_driver(driver)

    allocation = latest_allocation(home)
    run_to_end(home, *job_args(cluster, home, allocation, "--idle-timeout", "8"), timeout=900)

    recovery = catalog(home, "recoveries")[-1]
    placement = json.loads(recovery["placement"])
    local = recovery["subtasks_local"] / len(placement)
    report(f"driver kill: {local:.0%} of subtasks restored from local copies: {placement}")
    assert local >= 0.95
    assert all(p["host"] == p["hint"] == allocation[str(p["subtask"])] for p in placement)
    assert recovery["bytes_remote"] == 0
    report(check("clicks_per_user", home))


def test_host_lost_restores_its_subtasks_remotely_and_the_others_locally(
    s3_server, s3_bucket, private_cluster, tmp_path, monkeypatch
):
    cluster, home = private_cluster, tmp_path / "home"
    assert not any(k.startswith("AWS_ENDPOINT_URL") for k in os.environ), "the workers' env"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)  # this process writes and reads S3
    files = f"s3://{s3_bucket}/files"
    monkeypatch.setenv(FILES_ENV, files)  # where the job's definition reads them from
    for n in range(4):
        put_file(files, f"clicks-{n:03d}.json", clicks(16_000, n))
    scratch = str(home / "tmp")  # the driver's Spark and Python scratch space, on its disk
    env = {  # the driver's alone
        "AWS_ENDPOINT_URL_S3": s3_server,
        "SPARK_LOCAL_DIRS": scratch,
        "TMPDIR": scratch,
    }
    (home / "tmp").mkdir()
    paths = RuntimePaths(f"s3://{s3_bucket}/chk", f"s3://{s3_bucket}/wh", "", "")
    s3 = ("--checkpoint-root", paths.checkpoint_root, "--warehouse", paths.warehouse)
    where = {"env": env, "view": cluster.driver_view}
    driver = start_and_wait_for_checkpoints(
        cluster, home, 3, *s3, job=FILE_JOB, catalog_root=paths.catalog, **where
    )
    lost = HOSTS[1]
    cluster.kill_host(lost)
    rc = driver.wait(timeout=300)
    assert rc != 0, "the attempt failed with its host"
    log = (home / "driver.log").read_text(errors="replace")

    name = job_name_of(FILE_JOB)
    allocation = latest_allocation(home, paths.catalog, name)
    again = ("--idle-timeout", "8", "--executor-wait-s", "5", *s3)
    args = job_args(cluster, home, allocation, *again, job=FILE_JOB)
    run_to_end(home, *args, timeout=900, **where)

    recovery = catalog(home, "recoveries", paths.catalog, name)[-1]
    placement = {p["subtask"]: p for p in json.loads(recovery["placement"])}
    report(f"host lost: restore placement {placement}")
    on_lost = {int(s) for s, h in allocation.items() if h == lost}
    assert on_lost, log[-3000:]
    for subtask, p in placement.items():
        assert p["host"] == HOSTS[0]
        assert p["source"] == ("remote" if subtask in on_lost else "local"), p
    assert recovery["subtasks_remote"] == len(on_lost)
    assert recovery["subtasks_local"] == 4 - len(on_lost)
    # the driver's home holds its log, its hints and its scratch space alone (no catalog, no
    # output, no staged epoch, no local state), and each worker's local state root holds only
    # the subtasks it ran
    assert sorted(p.name for p in home.iterdir() if not p.name.startswith("hints-")) == [
        "driver.log",
        "tmp",
    ]
    held = {
        host: {int(d.name) for d in (cluster.workers[host].local_state_root / name).glob("*/*")}
        for host in HOSTS
    }  # <local state root>/<job>/<operator>/<subtask>
    assert held[lost] == on_lost and held[HOSTS[0]] == {0, 1, 2, 3}, held
    report(check(name, home, paths.output, lambda _: read_files(files)))
