"""A job with every durable role on the S3 server, reached through a proxy that answers some
requests 503 SlowDown and holds others for seconds, on checkpoint files, acks, manifests,
staged output and catalog and sink commits alike (tests/s3_proxy.py). The job must retry,
lose nothing and duplicate nothing (the output equals the pandas reference), and no checkpoint
may be marked CORRUPT for a transient error: every retained one verifies."""

from __future__ import annotations

import pytest

from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.sources.generate import generate
from tests import tiers
from tests.e2e_util import completed_checkpoints_at, report, run_to_end, verify_retained
from tests.reference import check
from tests.s3_proxy import FAIL, PASS, STALL, FaultyProxy

pytestmark = [pytest.mark.slow, pytest.mark.landing, pytest.mark.spark, pytest.mark.s3]

JOB = "clicks_per_user"
FAIL_RATE, STALL_RATE, STALL_S = 0.05, 0.01, 1.5
ROLES = ("chk", "catalog", "tables", "staging")  # the roots' last parts, as the test sets them


def test_503s_and_stalls_on_every_role_lose_nothing_and_mark_nothing_corrupt(
    s3_server, s3_bucket, tmp_path, monkeypatch
):
    rng = tiers.rng("s3 faults")  # which requests fail or stall
    report(f"\nS3 faults: seed {tiers.SEED}")

    first_fault: set[str] = set()  # every role's first request after the start fails

    def plan(method: str, path: str, n: int) -> tuple[str, float]:
        if n < 20:  # let the probes at the start pass: they are not what is tested here
            return PASS, 0.0
        role = next((r for r in ROLES if f"/{r}/" in path), None)
        if role is not None and role not in first_fault:
            first_fault.add(role)
            return FAIL, 0.0
        draw = rng.random()
        if draw < FAIL_RATE:
            return FAIL, 0.0
        if draw < FAIL_RATE + STALL_RATE:
            return STALL, STALL_S
        return PASS, 0.0

    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=12_000, seed=7, users=3_000)
    root = f"s3://{s3_bucket}"
    paths = RuntimePaths(f"{root}/chk", f"{root}/wh", str(home / "local-state"), str(home / "log"))
    roles = ["--checkpoint-root", paths.checkpoint_root, "--warehouse", paths.warehouse]
    args = ["run", JOB, *roles, "--until-caught-up", "--interval-ms", "500"]
    with FaultyProxy(s3_server, plan) as proxy:
        env = {"AWS_ENDPOINT_URL_S3": proxy.url}
        run_to_end(
            home, *args, "--max-records-per-partition", "2000", "--max-batches", "4", env=env
        )
        generate(home / "log", "clicks", "clicks", count=4_000, seed=8, users=3_000)
        run_to_end(home, *args, "--max-records-per-partition", "2000", env=env)  # a restore
    faults = proxy.faults()
    kinds = {kind: sum(1 for f in faults if f[2] == kind) for kind in (FAIL, STALL)}
    where = {role: sum(1 for f in faults if f"/{role}/" in f[1]) for role in ROLES}
    report(f"S3 faults: {kinds} among {len(proxy.seen)} requests, by role {where}")
    assert all(where.values()), f"every role met faults: {where}"

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)  # checked without the proxy
    rows = completed_checkpoints_at(paths, JOB)
    assert rows and all(r["status"] != "CORRUPT" for r in rows), rows
    verified = verify_retained(paths, JOB)
    report(f"S3 faults: {len(rows)} checkpoints, none CORRUPT; {verified} verify")
    report(f"S3 faults: {check(JOB, home, paths.output)}")
