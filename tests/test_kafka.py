"""The Kafka source against a real KRaft broker: a driver killed with SIGKILL after two
checkpoints restarts from the checkpoint's offsets, and the output equals, epoch by epoch, what
pandas computes from the records the broker stored (tests/reference.py); the same for a topic
of Avro records, encoded here by hand from Avro's specification, with undecodable values and null
keys dead-lettered once each."""

from __future__ import annotations

import base64
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
from tests.row_check import compare_rows

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
    run_to_end(home, "run", JOB, "--until-caught-up", env=env)
    restored = [r for r in completed_checkpoints(home, JOB) if r["attempt"] == 2]
    assert restored, "the second attempt took checkpoints"

    cuts = job_cuts(home, [JOB])
    inputs = {"clicks": cuts.assign(clicks, "clicks")}
    outputs = {"clicks_per_user": output(home, JOB)}
    report(compare_outputs("clicks_per_user", inputs, cuts.epochs, outputs))


def avro_long(n: int) -> bytes:
    """Avro's long: zig-zag, then little-endian base-128 groups."""
    n, out = (n << 1) ^ (n >> 63), bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def avro_string(s: str | None, nullable: bool = False) -> bytes:
    """A string (a ``["null", "string"]`` union's branch index first, when ``nullable``)."""
    if s is None:
        return avro_long(0)
    data = s.encode()
    return (avro_long(1) if nullable else b"") + avro_long(len(data)) + data


def avro_click(user: str | None, url: str, ts: int, referrer: str | None = None) -> bytes:
    """A record of tests/kafka_jobs.py's ``CLICK_AVRO``, in the order of its fields."""
    return (
        avro_string(user, nullable=True)
        + avro_string(url)
        + avro_string(referrer, nullable=True)
        + avro_long(ts)
    )


AVRO_JOB = "tests.kafka_jobs:avro_clicks"
BAD_AVRO = {  # value -> the reason the dead letter must give
    b"\xff\xff\xff\xff": "not Avro of the source's avro_schema",  # a union branch out of range
    avro_click("user-7", "/p/1", 1)[:4]: "not Avro of the source's avro_schema",  # truncated
    avro_click(None, "/p/2", 2): "null key 'user'",
}


def test_avro_records_decode_with_the_given_schema_and_bad_ones_are_dead_lettered(broker, tmp_path):
    good = [json.loads(r) for p in (0, 1) for r in _records("clicks", 12, p, 0, 12_000, 3_000)]
    values = [avro_click(c["user"], c["url"], c["ts"], c["url"][::-1]) for c in good]
    for i, bad in enumerate(BAD_AVRO):  # among the good ones, under a key of theirs
        good.insert(5_000 * (i + 1), {"user": good[5_000 * (i + 1)]["user"], "bad": bad})
        values.insert(5_000 * (i + 1), bad)
    keyed = [(c["user"], v) for c, v in zip(good, values, strict=True)]
    stored = broker.produce_binary("clicks_avro", keyed)
    rows = pd.DataFrame(good).assign(
        partition=[p for p, _ in stored], offset=[o for _, o in stored]
    )
    is_bad = rows["bad"].notna()

    env = {"CUTLINE_KAFKA_BOOTSTRAP": broker.bootstrap}
    home = tmp_path / "avro"
    args = ("run", AVRO_JOB, "--idle-timeout", "5", "--max-records-per-partition", "2000")
    proc = cutline(home, *args, env=env)
    wait_for(lambda: len(checkpoints_so_far(home, "avro_clicks")) >= 2, 300, "checkpoints", proc)
    kill_driver(proc)
    run_to_end(home, "run", AVRO_JOB, "--until-caught-up", *args[4:], env=env)

    cuts = job_cuts(home, ["avro_clicks", "avro_clicks_dead_letters"])
    clicks = rows[~is_bad].drop(columns="bad").astype({"ts": "int64"})
    inputs = {"clicks": cuts.assign(clicks, "clicks")}
    outputs = {"clicks_per_user": output(home, "avro_clicks")}
    report(compare_outputs("clicks_per_user", inputs, cuts.epochs, outputs))
    bad = rows[is_bad].assign(raw=[base64.b64encode(v).decode() for v in rows["bad"][is_bad]])
    dead = output(home, "avro_clicks_dead_letters")
    expected = cuts.assign(bad[["partition", "offset", "raw"]], "clicks")
    report(compare_rows(dead, expected, ["partition", "offset"], ["raw"], "dead letters"))
    assert sorted(dead["reason"]) == sorted(BAD_AVRO.values())


def test_a_schema_field_missing_from_avro_or_of_another_type_is_refused_naming_it(spark):
    from cutline import JobDefinitionError, KafkaSource
    from tests.kafka_jobs import CLICK_AVRO

    decoded = spark.createDataFrame([], "_v struct<user:string,url:string,ts:bigint>")
    source = KafkaSource(
        "c", "c", "user string, ts bigint", 2, value_format="avro", avro_schema=CLICK_AVRO
    )
    columns, _ = source._fields(decoded)
    assert len(columns) == 2
    for schema, message in [
        ("user string, ts int", "field 'ts' is bigint in avro_schema, int in schema"),
        ("user string, country string", "field 'country' of schema is not in avro_schema"),
    ]:
        wrong = KafkaSource("c", "c", schema, 2, value_format="avro", avro_schema=CLICK_AVRO)
        with pytest.raises(JobDefinitionError, match=message):
            wrong._fields(decoded)
