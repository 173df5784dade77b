"""One configuration for every process: the CLI, the Dagster resources (and so the streaming
runs, sensors, schedules and checks) and the drivers read the same settings."""

from __future__ import annotations

import json
import os

import pytest

from orchestration.resources import CutlinePaths, S3Resource, SparkSubmit
from spark_jobs.commands.handlers import runtime_paths
from spark_jobs.commands.parser import build_parser
from spark_jobs.deploy.settings import load_settings
from spark_jobs.errors import ConfigurationError


@pytest.fixture
def deployment(tmp_path, monkeypatch):
    """A deployment configured by a file, one setting overridden by the environment."""
    config = tmp_path / "cutline.toml"
    config.write_text(
        f'home = "{tmp_path / "home"}"\n'
        'checkpoint_root = "s3://bucket/checkpoints"\n'
        'spark_master = "spark://127.0.0.1:7077"\n'
        'warehouse = "/from/the/file"\n'
    )
    for var in ("CUTLINE_HOME", "CUTLINE_CHECKPOINT_ROOT", "CUTLINE_LOCAL_STATE_ROOT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUTLINE_CONFIG", str(config))
    monkeypatch.setenv("CUTLINE_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000")
    return tmp_path


def test_every_process_reads_the_same_settings(deployment):
    settings = load_settings()
    paths = settings.paths()
    assert paths.checkpoint_root == "s3://bucket/checkpoints"  # the file
    assert paths.warehouse == str(deployment / "warehouse")  # the environment wins
    assert paths.local_state_root == str(deployment / "home" / "local-state")  # under home
    cli = runtime_paths(build_parser().parse_args(["run", "clicks_per_user"]))
    assert cli == paths == CutlinePaths().paths()
    assert SparkSubmit().master == "spark://127.0.0.1:7077"
    assert S3Resource().endpoint_url == "http://127.0.0.1:9000"
    # a --home on the command line puts every path no flag names under that home
    mine = runtime_paths(build_parser().parse_args(["--home", str(deployment / "x"), "run", "j"]))
    assert mine.checkpoint_root == str(deployment / "x" / "checkpoints")


@pytest.mark.parametrize(
    "text, message",
    [
        ("home = ", "not valid TOML"),
        ('checkpoint_rot = "s3://b/c"', "unknown settings \\['checkpoint_rot'\\]"),
        ("warehouse = 3", "must be non-empty strings"),
    ],
)
def test_a_bad_settings_file_is_a_clear_error(tmp_path, monkeypatch, text, message):
    config = tmp_path / "cutline.toml"
    config.write_text(text)
    with pytest.raises(ConfigurationError, match=message):
        load_settings({"CUTLINE_CONFIG": str(config)})
    with pytest.raises(ConfigurationError, match="cannot read it"):
        load_settings({"CUTLINE_CONFIG": str(tmp_path / "missing.toml")})


def test_config_explains_each_setting_and_where_it_came_from(tmp_path, capsys, monkeypatch):
    """``cutline config``: a flag beats the environment, which beats the file, which beats the
    default under home; ``--home`` puts every path no flag names under it, and says beside each
    what it set aside; secrets masked."""
    from spark_jobs.commands.main import main

    config = tmp_path / "cutline.toml"
    config.write_text('spark_master = "spark://10.0.0.1:7077"\nlog_root = "/from/file/log"\n')
    for var in ("CUTLINE_HOME", "CUTLINE_WAREHOUSE", "CUTLINE_LOG_ROOT", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CUTLINE_CONFIG", str(config))
    monkeypatch.setenv("CUTLINE_CHECKPOINT_ROOT", "s3://bucket/chk")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://key:PLANTED@127.0.0.1:9000")
    assert main(["config", "--json", "--warehouse", str(tmp_path / "wh")]) == 0
    rows = {r["name"]: (r["value"], r["source"]) for r in json.loads(capsys.readouterr().out)}
    assert rows["checkpoint_root"] == ("s3://bucket/chk", "environment $CUTLINE_CHECKPOINT_ROOT")
    assert rows["warehouse"] == (str(tmp_path / "wh"), "flag --warehouse")
    assert rows["log_root"] == ("/from/file/log", f"file {config} ($CUTLINE_CONFIG)")
    assert rows["spark_master"][1].startswith("file ")
    assert rows["s3_endpoint"] == ("http://***@127.0.0.1:9000", "environment $AWS_ENDPOINT_URL_S3")
    assert rows["s3_region"] == (None, "not set")
    home = str((tmp_path / "h").resolve())
    assert main(["--home", home, "config", "--json"]) == 0
    rows = {r["name"]: (r["value"], r["source"]) for r in json.loads(capsys.readouterr().out)}
    assert rows["home"] == (home, "flag --home")
    assert rows["checkpoint_root"] == (
        f"{home}/checkpoints",
        "default, under home; --home wins over s3://bucket/chk (environment "
        "$CUTLINE_CHECKPOINT_ROOT)",
    )
    assert rows["log_root"] == (
        f"{home}/log",
        f"default, under home; --home wins over /from/file/log (file {config} ($CUTLINE_CONFIG))",
    )
    assert rows["warehouse"] == (f"{home}/warehouse", "default, under home"), "nothing set aside"
    assert rows["spark_master"][1].startswith("file "), "not a path: --home leaves it"


def test_the_s3_resources_endpoint_applies_inside_its_environment_only(monkeypatch):
    """Ops that open storage by URL reach the run's endpoint inside ``environment()``; the
    process's own settings come back after (credentials are never part of it)."""
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    s3 = S3Resource(endpoint_url="http://127.0.0.1:9999", region="us-east-2")
    with s3.environment():
        assert os.environ["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:9999"
        assert os.environ["AWS_DEFAULT_REGION"] == "us-east-2"
    assert "AWS_ENDPOINT_URL_S3" not in os.environ
    assert os.environ["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert not [k for k in s3.env() if "KEY" in k or "SECRET" in k]


@pytest.mark.s3
def test_the_commands_reach_s3_through_the_files_endpoint_alone(tmp_path, s3_server, s3_bucket):
    """With the endpoint named only in the settings file, ``cutline checkpoints`` and ``cutline
    gc`` (and a driver, the same process) reach the S3 server, and ``cutline config`` says the
    file set it (issue 37: the command went to AWS and died of a DNS error)."""
    import subprocess
    import sys

    from spark_jobs.catalog.delta_catalog import DeltaCatalog
    from tests.test_delta_catalog import row

    warehouse, checkpoints = f"s3://{s3_bucket}/wh", f"s3://{s3_bucket}/chk"
    os.environ["AWS_ENDPOINT_URL_S3"] = s3_server  # this process's, to write the catalog
    try:
        catalog = DeltaCatalog(f"{warehouse}/catalog")
        job = "clicks_per_user"
        catalog.commit_checkpoint(row(1, catalog.begin_attempt(job), job_id=job))
    finally:
        del os.environ["AWS_ENDPOINT_URL_S3"]
    config = tmp_path / "cutline.toml"
    config.write_text(
        f'home = "{tmp_path / "home"}"\nwarehouse = "{warehouse}"\n'
        f'checkpoint_root = "{checkpoints}"\ns3_endpoint = "{s3_server}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_ENDPOINT", "CUTLINE_"))}
    env["CUTLINE_CONFIG"] = str(config)

    def cutline(*args: str, code: int = 0) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "spark_jobs.commands", *args]
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == code, out.stderr[-2000:]
        return out

    listed = json.loads(cutline("checkpoints", job, "--json").stdout)
    assert [c["checkpoint_id"] for c in listed] == [1]
    # GC read the catalog and listed the checkpoint root on the server (no manifest was put)
    refused = cutline("gc", job, "--dry-run", code=2).stderr
    assert f"{checkpoints} holds none of the manifests of {job}'s completed" in refused
    rows = {r["name"]: r for r in json.loads(cutline("config", "--json").stdout)}
    assert rows["s3_endpoint"]["value"] == s3_server
    assert rows["s3_endpoint"]["source"] == f"file {config} ($CUTLINE_CONFIG)"
