"""The two-worker standalone cluster that stands in for two hosts: each worker's executors see
their own host name and local state root, and an executor killed with SIGKILL is gone while its
worker stays."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spark_jobs.deploy.standalone import StandaloneCluster
from tests.e2e_util import ROOT, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.spark]

# A driver in its own process (the test process already has a local SparkContext): which host
# name and local state root does each of 8 tasks see?
DRIVER = """
import json, os, sys
from spark_jobs.deploy.session import build_spark
spark = build_spark(sys.argv[1], "cutline-standalone-test")
seen = spark.sparkContext.parallelize(range(8), 8).map(
    lambda _: (os.environ.get("CUTLINE_HOST"), os.environ.get("CUTLINE_LOCAL_STATE_ROOT"))
).collect()
print(json.dumps(sorted(set(map(tuple, seen)))))
spark.stop()
"""


def test_each_worker_is_its_own_host(tmp_path):
    with StandaloneCluster(tmp_path / "cluster") as cluster:
        assert cluster.alive_hosts() == {"127.0.0.2", "127.0.0.3"}
        driver = subprocess.run(
            [sys.executable, "-c", DRIVER, cluster.master_url],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert driver.returncode == 0, driver.stderr[-3000:]
        seen = {tuple(p) for p in json.loads(driver.stdout.strip().splitlines()[-1])}
        assert seen == {
            (host, str(worker.local_state_root)) for host, worker in cluster.workers.items()
        }

        # the executors outlive the application only as long as it runs: start one that
        # lingers, then kill one host's executor and see it gone while the worker stays
        lingering = subprocess.Popen(
            [sys.executable, "-c", DRIVER.replace("spark.stop()", "import time; time.sleep(600)"),
             cluster.master_url],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_for(lambda: cluster.workers["127.0.0.2"].executor_pids(), 120, "an executor")
            killed = cluster.kill_executors("127.0.0.2")
            assert killed
            wait_for(
                lambda: not set(killed) & set(cluster.workers["127.0.0.2"].executor_pids()),
                30,
                "the executor to die",
            )
            assert cluster.alive_hosts() == {"127.0.0.2", "127.0.0.3"}
        finally:
            lingering.kill()
            lingering.wait()
