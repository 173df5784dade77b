"""``clicks_per_user`` on a Kafka topic of Avro records (tests/test_kafka.py), bad records
dead-lettered. Loaded by ``cutline run tests.kafka_jobs:avro_clicks``; brokers from
``$CUTLINE_KAFKA_BOOTSTRAP``."""

from __future__ import annotations

import dataclasses
import json

from cutline import DeltaSink, JobDefinition, KafkaSource
from spark_jobs.job_loader import get_job

# the writer's schema: a nullable user (a null one is a bad record) and a field the job ignores
CLICK_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Click",
        "namespace": "cutline.tests",
        "fields": [
            {"name": "user", "type": ["null", "string"]},
            {"name": "url", "type": "string"},
            {"name": "referrer", "type": ["null", "string"], "default": None},
            {"name": "ts", "type": "long"},
        ],
    }
)


def avro_clicks() -> JobDefinition:
    job = get_job("clicks_per_user")
    source = KafkaSource(
        "clicks",
        "clicks_avro",
        "user string, url string, ts long",
        partitions=2,
        max_records_per_partition=5_000,
        value_format="avro",
        avro_schema=CLICK_AVRO,
    )
    return dataclasses.replace(
        job,
        name="avro_clicks",
        sources=(source,),
        sink=DeltaSink("clicks_out", "avro_clicks"),
        bad_records="dead_letter",
    )
