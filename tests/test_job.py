"""Job definitions fail at definition time with a message that names the field."""

from __future__ import annotations

import dataclasses

import pytest

from cutline import (
    DeltaSink,
    DeltaUpsertSink,
    JobDefinitionError,
    KeyedProcess,
    LogSource,
    Transform,
)
from cutline.operators import EnrichWithLatest, KeyedAggregate, WindowedAggregate
from spark_jobs.commands.handlers import job_for_run
from spark_jobs.commands.parser import build_parser
from spark_jobs.job_loader import get_job, job_names


def test_every_job_comes_from_an_installed_package():
    # examples/basics and examples/sessions, through their cutline.jobs entry points
    assert job_names() == [
        "clicks_per_user",
        "clicks_per_user_kafka",
        "country_clicks",
        "enriched_orders",
        "sessions",
        "user_activity",
        "windowed_revenue",
    ]
    assert get_job("sessions").operator.uid == "sessionize"
    assert get_job("cutline_sessions.jobs:sessions").name == "sessions"
    job = get_job("enriched_orders")
    assert set(job.operator.inputs) == {"orders", "profiles"}
    with pytest.raises(JobDefinitionError, match="no job named 'nope'"):
        get_job("nope")


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(parallelism=0), "job.parallelism"),
        (dict(parallelism=300), "job.parallelism"),
        (dict(max_parallelism=0), "job.max_parallelism"),
        (dict(name="Bad Name"), "job.name"),
        (dict(sources=()), "job.sources"),
    ],
)
def test_bad_job_fields(change, field):
    job = get_job("clicks_per_user")
    with pytest.raises(JobDefinitionError, match=field.replace(".", r"\.")):
        dataclasses.replace(job, **change)


def test_bad_operator_and_source_fields():
    with pytest.raises(JobDefinitionError, match=r"operator\.key_type"):
        KeyedAggregate("a", "s", "k", "float", {"n": ("count", None)})
    with pytest.raises(JobDefinitionError, match=r"stage 'a': aggregates\['n'\] function"):
        KeyedAggregate("a", "s", "k", "string", {"n": ("median", "v")})
    for bad in ("Bad Name", "_hidden", "_last_at"):
        with pytest.raises(JobDefinitionError, match=f"output column '{bad}' must start"):
            KeyedAggregate("a", "s", "k", "string", {bad: ("count", None)})
    with pytest.raises(JobDefinitionError, match="needs an input column"):
        KeyedAggregate("a", "s", "k", "string", {"n": ("sum", None)})
    with pytest.raises(JobDefinitionError, match="'last' is supported by KeyedAggregate with"):
        KeyedAggregate("a", "s", "k", "string", {"p": ("last", "payload")})
    with pytest.raises(JobDefinitionError, match="'last' is supported by KeyedAggregate with"):
        WindowedAggregate("w", "s", "k", "string", "ts", 10, 0, {"p": ("last", "payload")})
    with pytest.raises(JobDefinitionError, match=r"stage 'w': window_ms"):
        WindowedAggregate("w", "s", "k", "string", "ts", 0, 0, {"n": ("count", None)})
    with pytest.raises(JobDefinitionError, match=r"source\.max_records_per_partition"):
        LogSource("s", "t", "a string", max_records_per_partition=0)
    job = get_job("clicks_per_user")
    other = dataclasses.replace(job.operator, inputs={"missing": "user"})
    with pytest.raises(JobDefinitionError, match="stage 'count_by_user': input 'missing'"):
        dataclasses.replace(job, operator=other)


def test_a_pipeline_chains_stages_and_sends_each_sink_the_output_of_its_stage():
    job = get_job("clicks_per_user")
    first = job.operator
    second = KeyedAggregate("per_count", first.name, "clicks", "bigint", {"users": ("count", None)})
    sinks = (DeltaSink("per_user", "per_user", stage=first.name), DeltaSink("hist", "hist"))
    chained = dataclasses.replace(job, operator=(first, second), sink=sinks)
    assert chained.stages == (first, second)
    assert chained.source_inputs == {"clicks": "user"}
    assert chained.sinks_of(first) == [sinks[0]] and chained.sinks_of(second) == [sinks[1]]
    assert job.stages == (first,) and job.outputs == (job.sink,)

    def bad(match: str, **change) -> None:
        with pytest.raises(JobDefinitionError, match=match):
            dataclasses.replace(chained, **change)

    bad(
        r"source 'clicks' is read by stages 'count_by_user' and 'per_count'",
        operator=(first, dataclasses.replace(second, inputs={"clicks": "clicks"})),
    )
    bad(
        r"stage 'per_count': input 'nope' is neither a source \['clicks'\] nor an earlier stage",
        operator=(first, dataclasses.replace(second, inputs={first.name: "clicks", "nope": "x"})),
    )
    third = KeyedAggregate("third", first.name, "user", "string", {"n": ("count", None)})
    bad(
        r"stage 'third' must read the output of the stage before it, 'per_count'",
        operator=(first, second, third),
    )
    bad(
        r"stages and sources must have different names, got \['clicks'\]",
        operator=(first, dataclasses.replace(second, name="clicks")),
    )
    bad(
        r"stages' names must be unique",
        operator=(first, dataclasses.replace(second, name=first.name)),
    )
    bad(
        r"stages' uids must be unique", operator=(first, dataclasses.replace(second, uid=first.uid))
    )
    bad(
        r"sink 'hist': stage 'nope' is not one of the job's stages",
        sink=(sinks[0], DeltaSink("hist", "hist", stage="nope")),
    )
    bad(r"sinks' targets must be unique", sink=(sinks[0], DeltaSink("other", "per_user")))
    upsert = DeltaUpsertSink("other", "per_user", key="user")  # an upsert into the append table
    bad(r"sinks' targets must be unique", sink=(sinks[0], upsert))
    bad(r"job.sink must be Sinks .*, got 'per_user'", sink=(sinks[0], "per_user"))
    bad(r"'dead_letters' is the dead-letter table's", sink=(DeltaSink("dead_letters", "x"),))
    bad(
        r"transform 't': source 'orders' is not one of the job's sources",
        transforms=(Transform("t", "orders", lambda df: df),),
    )
    with pytest.raises(JobDefinitionError, match="transform 't': function must be callable"):
        Transform("t", "clicks", "not a function")  # type: ignore[arg-type]


def test_run_overrides_apply_to_the_registered_job():
    args = build_parser().parse_args(
        ["run", "enriched_orders", "--interval-ms", "500", "--max-records-per-partition", "7"]
    )
    job = job_for_run(args)
    assert job.checkpoint.interval_ms == 500
    assert [s.max_records_per_partition for s in job.sources] == [7, 7]
    assert job_for_run(build_parser().parse_args(["run", "enriched_orders"])) == get_job(
        "enriched_orders"
    )


def test_a_later_stage_may_read_sources_and_earlier_stages_besides_the_stage_before_it():
    """A two-input stage anywhere: the second stage joins the first's output with a source, the
    third reads the second and the first; each source has the key of the stage reading it."""
    job = get_job("clicks_per_user")
    first = job.operator
    profiles = LogSource("profiles", "profiles", "user string, country string, ts long")
    enrich = EnrichWithLatest(
        "with_profile", first.name, "profiles", "user", "string", ("country",), "ts"
    )
    third = KeyedProcess(
        "both", {"with_profile": "user", first.name: "user"}, "string", enrich.function
    )
    chained = dataclasses.replace(
        job, sources=(*job.sources, profiles), operator=(first, enrich, third)
    )
    assert chained.source_inputs == {"clicks": "user", "profiles": "user"}
    assert [chained.reader_of(s) for s in ("clicks", "profiles")] == [0, 1]
    assert [chained.readers_of(i) for i in range(3)] == [[1, 2], [2], []]


def test_kafka_consumer_properties_pass_through_to_the_connector():
    from cutline import KafkaSource

    secure = {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "PlainLoginModule required username='u' password='p';",
    }
    source = KafkaSource(
        "clicks", "clicks", "user string", 2, bootstrap_servers="b:9092", options=secure
    )

    class Recorder:  # Spark's DataStreamReader, as far as the reader uses it
        def __init__(self) -> None:
            self.options: dict[str, str] = {}

        def format(self, name: str) -> Recorder:
            assert name == "kafka"
            return self

        def option(self, key: str, value: str) -> Recorder:
            self.options[key] = value
            return self

    reader = source.connector(Recorder(), {"0": 5})
    assert {k: reader.options[k] for k in secure} == secure
    assert reader.options["kafka.bootstrap.servers"] == "b:9092"
    with pytest.raises(JobDefinitionError, match=r"option 'subscribe' must be a Kafka property"):
        KafkaSource("c", "c", "user string", 1, options={"subscribe": "other"})
    with pytest.raises(JobDefinitionError, match="give the brokers as bootstrap_servers"):
        KafkaSource("c", "c", "user string", 1, options={"kafka.bootstrap.servers": "x:1"})


def test_kafka_avro_definitions_are_checked():
    from cutline import KafkaSource
    from tests.kafka_jobs import CLICK_AVRO

    source = KafkaSource("c", "c", "user string", 2, value_format="avro", avro_schema=CLICK_AVRO)
    packages = source.spark_dependencies().packages
    assert any("spark-avro" in p for p in packages), packages
    with pytest.raises(JobDefinitionError, match="value_format must be one of"):
        KafkaSource("c", "c", "user string", 1, value_format="protobuf")
    with pytest.raises(JobDefinitionError, match="avro_schema goes with value_format='avro'"):
        KafkaSource("c", "c", "user string", 1, avro_schema=CLICK_AVRO)
    with pytest.raises(JobDefinitionError, match="avro_schema goes with value_format='avro'"):
        KafkaSource("c", "c", "user string", 1, value_format="avro")
    with pytest.raises(JobDefinitionError, match="avro_schema is not JSON"):
        KafkaSource("c", "c", "user string", 1, value_format="avro", avro_schema="{record")
    with pytest.raises(JobDefinitionError, match="must be an Avro record"):
        KafkaSource("c", "c", "user string", 1, value_format="avro", avro_schema='"string"')
