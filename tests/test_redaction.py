"""Secrets never leave a process in clear (state/redaction.py): URL user info, settings whose
names say they hold a secret, AWS access key ids; masked in the storage errors, the driver's
log lines and events, its failure line (the catalog's ``failure_reason``) and the Dagster op's
logged ``spark-submit`` command line. Ordinary text passes unchanged."""

from __future__ import annotations

import json

import pytest

from orchestration.resources import SparkSubmit
from spark_jobs.errors import failure_summary
from spark_jobs.events import EventChannel
from state.redaction import redact, redact_argv
from state.storage import open_storage

PLANTED = "PlantedSecret/42+x"
KEY_ID = "AKIAPLANTED000000000"


@pytest.mark.parametrize(
    "text",
    [
        f"s3://{KEY_ID}:{PLANTED}@bucket/prefix",
        f"http://user:{PLANTED}@127.0.0.1:9000/bucket",
        f"--conf spark.hadoop.fs.s3a.secret.key={PLANTED}",
        f"spark.hadoop.fs.s3a.access.key={KEY_ID}",
        f"kafka.sasl.jaas.config=PlainLoginModule required username=u password='{PLANTED}';",
        f"spark.ssl.keyPassword={PLANTED} spark.authenticate.secret={PLANTED}",
        json.dumps({"AWS_SESSION_TOKEN": PLANTED, "AWS_SECRET_ACCESS_KEY": PLANTED}),
        f"key {KEY_ID} in the environment",
    ],
)
def test_every_planted_secret_is_masked(text):
    masked = redact(text)
    assert PLANTED not in masked and KEY_ID not in masked and "***" in masked


@pytest.mark.parametrize(
    "text",
    [
        "checkpoint 7 of clicks_per_user at s3://bucket/clicks_per_user/chk-7/_metadata",
        "endpoint http://127.0.0.1:9000, region us-east-1",
        "--conf spark.master=local[*] --conf spark.sql.shuffle.partitions=4",
        "subtask 1 of stage 'count_by_user' read key groups [64, 127]",
    ],
)
def test_ordinary_text_passes_unchanged(text):
    assert redact(text) == text


def test_a_json_event_stays_json():
    event = {"kind": "started", "endpoint": f"http://u:{PLANTED}@h:1", "secret_key": PLANTED}
    back = json.loads(redact(json.dumps(event)))
    assert back == {"kind": "started", "endpoint": "http://***@h:1", "secret_key": "***"}


def test_a_storage_url_with_user_info_is_refused_without_echoing_it():
    with pytest.raises(ValueError) as refused:
        open_storage(f"s3://{KEY_ID}:{PLANTED}@bucket/prefix")
    assert PLANTED not in str(refused.value) and KEY_ID not in str(refused.value)
    assert "s3://***@bucket/prefix" in str(refused.value)


def test_the_driver_log_events_and_failure_line_are_redacted(capsys, monkeypatch):
    monkeypatch.setenv("CUTLINE_EVENTS", "stdout")
    channel = EventChannel()
    channel.log(f"retrying s3://{KEY_ID}:{PLANTED}@bucket")
    channel.emit("failed", {"reason": f"spark.hadoop.fs.s3a.secret.key={PLANTED}"})
    out = capsys.readouterr().out
    assert PLANTED not in out and KEY_ID not in out
    event = json.loads(out.splitlines()[-1].removeprefix("CUTLINE_EVENT "))
    assert event == {"kind": "failed", "reason": "spark.hadoop.fs.s3a.secret.key=***"}
    trace = f"An error occurred while calling o42.start.\nCaused by: boom: password={PLANTED}"
    assert PLANTED not in failure_summary(trace)


def test_the_logged_submit_command_line_hides_secret_spark_conf():
    submit = SparkSubmit(master="local[2]", conf={"spark.hadoop.fs.s3a.secret.key": PLANTED})
    argv = submit.command(["run", "clicks_per_user"]).argv
    assert any(PLANTED in a for a in argv), "the driver itself gets the value"
    logged = " ".join(redact_argv(argv))
    assert PLANTED not in logged and "spark.hadoop.fs.s3a.secret.key=***" in logged
