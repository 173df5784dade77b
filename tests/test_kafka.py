"""The Kafka source against a real KRaft broker: restarted from the checkpoint's offsets after a
SIGKILL of the driver, the output equals an uninterrupted run."""

from __future__ import annotations

import json

import pytest

from spark_jobs.sources.generate import _records
from tests.e2e_util import (
    completed_checkpoints,
    cutline,
    kill_driver,
    run_to_end,
    table_rows,
    wait_for,
)
from tests.kafka_broker import KafkaBroker

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


def output(home):
    return table_rows(home / "warehouse" / "tables" / JOB)


def test_kafka_source_restarts_from_checkpoint_offsets(broker, tmp_path):
    env = {"CUTLINE_KAFKA_BOOTSTRAP": broker.bootstrap}
    reference_home = tmp_path / "reference"
    run_to_end(reference_home, "run", JOB, "--idle-timeout", "30", env=env)
    reference = output(reference_home)
    latest = {}
    for user, clicks, _ts, _epoch in reference:
        latest[user] = max(latest.get(user, 0), clicks)
    assert sum(latest.values()) == 2 * PER_PARTITION, "every produced record counted once"

    home = tmp_path / "killed"
    proc = cutline(home, "run", JOB, "--idle-timeout", "30", env=env)
    wait_for(lambda: len(completed_checkpoints(home, JOB)) >= 2, 300, "2 checkpoints", proc)
    kill_driver(proc)
    run_to_end(home, "run", JOB, "--idle-timeout", "30", env=env)
    restored = [r for r in completed_checkpoints(home, JOB) if r["attempt"] == 2]
    assert restored, "the second attempt took checkpoints"
    assert output(home) == reference
