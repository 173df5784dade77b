"""The Kafka source against a real KRaft broker: a driver killed with SIGKILL after two
checkpoints restarts from the checkpoint's offsets, and the output equals, epoch by epoch, what
pandas computes from the records the broker stored (tests/reference.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from spark_jobs.sources.generate import _records
from tests.e2e_util import (
    checkpoints_so_far,
    completed_checkpoints,
    cutline,
    kill_driver,
    report,
    run_to_end,
    wait_for,
)
from tests.kafka_broker import KafkaBroker
from tests.reference import compare_outputs, job_cuts, output

pytestmark = [pytest.mark.slow, pytest.mark.spark]

JOB = "clicks_per_user_kafka"
PER_PARTITION = 100_000


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = KafkaBroker(tmp_path_factory.mktemp("kafka")).start()
    lines = [r for p in (0, 1) for r in _records("clicks", 11, p, 0, PER_PARTITION, 20_000)]
    b.produce("clicks", ((json.loads(line)["user"], line) for line in lines))
    try:
        yield b
    finally:
        b.stop()


def stored_clicks(broker: KafkaBroker) -> pd.DataFrame:
    """The topic's records as the broker stored them, with partition and offset."""
    rows = [
        {**json.loads(value), "partition": partition, "offset": offset}
        for partition, offset, value in broker.records("clicks")
    ]
    return pd.DataFrame(rows)


def test_kafka_source_restarts_from_checkpoint_offsets(broker, tmp_path):
    env = {"CUTLINE_KAFKA_BOOTSTRAP": broker.bootstrap}
    clicks = stored_clicks(broker)
    assert len(clicks) == 2 * PER_PARTITION, "the broker stored every produced record"

    home = tmp_path / "killed"
    proc = cutline(home, "run", JOB, "--idle-timeout", "5", env=env)
    wait_for(lambda: len(checkpoints_so_far(home, JOB)) >= 2, 300, "2 checkpoints", proc)
    kill_driver(proc)
    run_to_end(home, "run", JOB, "--idle-timeout", "5", env=env)
    restored = [r for r in completed_checkpoints(home, JOB) if r["attempt"] == 2]
    assert restored, "the second attempt took checkpoints"

    cuts = job_cuts(home, [JOB])
    inputs = {"clicks": cuts.assign(clicks, "clicks")}
    outputs = {"clicks_per_user": output(home, JOB)}
    report(compare_outputs("clicks_per_user", inputs, cuts.epochs, outputs))
