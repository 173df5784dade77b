"""Shared fixtures: a moto S3 server on loopback, fresh buckets, and both storage backends."""

from __future__ import annotations

import functools
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.deploy.python_env import PYTHON_VARIABLES
from state.storage import DurableStorage, LocalFileStorage, S3Storage
from tests.moto_server import MotoServer, MotoServerError

# the two tiers and the run's seed; where the slow tests' seconds go
pytest_plugins = ["tests.findings", "tests.tiers", "tests.startup_report"]

# PySpark's Python, named before any test starts a thread (spark_jobs/deploy/python_env.py
# refuses to write the environment while other threads run)
for _name in PYTHON_VARIABLES:
    os.environ.setdefault(_name, sys.executable)


@functools.cache
def _admin_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Endpoint url of a moto S3 server subprocess on 127.0.0.1, with dummy credentials set."""
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.delenv(name, raising=False)
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        no_proxy = os.environ.get("NO_PROXY") or os.environ.get("no_proxy") or ""
        for name in ("NO_PROXY", "no_proxy"):  # never send loopback traffic through a proxy
            env.setenv(name, ",".join(filter(None, [no_proxy, "127.0.0.1", "localhost"])))

        try:
            server = MotoServer(tmp_path_factory.mktemp("moto") / "server.stderr").start()
        except MotoServerError as e:
            pytest.fail(str(e), pytrace=False)
        try:
            yield server.endpoint
        finally:
            server.stop()


@pytest.fixture
def s3_bucket(s3_server: str) -> str:
    """Name of a freshly created, uniquely named bucket on the moto server."""
    name = f"cutline-test-{uuid.uuid4().hex[:16]}"
    _admin_client(s3_server).create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_root(s3_server: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://<fresh bucket>``, with the endpoint in this process's environment (as a
    deployment sets it), so every role under it is reached by boto3 and delta-rs alike."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    return f"s3://{s3_bucket}"


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> DurableStorage:
    """A LocalFileStorage on tmp_path, or an S3Storage on a fresh bucket under a prefix.

    The S3 storage uses a 5 MiB multipart threshold so tests can exercise multipart uploads.
    """
    if request.param == "local":
        return LocalFileStorage(tmp_path / "store")
    return S3Storage(
        request.getfixturevalue("s3_bucket"),
        "ckpt/root",
        endpoint_url=request.getfixturevalue("s3_server"),
        multipart_threshold=5 * 2**20,
    )


@pytest.fixture(scope="session")
def spark():
    """One local Spark session (Delta configured, to read tables with Spark as a user would)
    for every test that needs Spark."""
    from spark_jobs.deploy.session import build_spark

    session = build_spark("local[2]", "cutline-tests", delta=True)
    try:
        yield session
    finally:
        session.stop()


def pytest_terminal_summary(terminalreporter) -> None:
    """The figures tests measured (tests/e2e_util.py ``report``), under one heading."""
    from tests import findings

    figures = findings.collected("figure")
    if figures:
        terminalreporter.section("figures")
        for line in figures:
            terminalreporter.write_line(line)
