"""Bad records have a policy. By default a record that cannot be processed (not JSON, a string
where a number belongs, a null key) fails the attempt with one line naming its source, partition,
offset and reason, as a non-retryable error (exit 2). A job may instead skip such records into a
dead-letter Delta table, exactly once with its output (also across a kill), counted in the
checkpoints' manifests."""

from __future__ import annotations

from pathlib import Path

import pytest

from cutline.sources.log_format import append_records, partition_path
from spark_jobs.catalog.tables import read_delta
from spark_jobs.sources.generate import generate
from state.faults import ENV as KILL_ENV
from state.manifest import CheckpointManifest
from tests.e2e_util import completed_checkpoints, cutline, finish, last_line, report, run_to_end
from tests.reference import check, job_cuts, output, read_log
from tests.row_check import compare_rows

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.matrix("bad records")]

JOB = "clicks_per_user"
RUN = ["--until-caught-up", "--interval-ms", "1000", "--max-records-per-partition", "4000"]
BAD_LINES = [
    b'{"user":"user-1","url":"/p/1","ts":17672256',  # truncated
    b'{"user":"user-2","url":"/p/2","ts":"yesterday"}',  # a string where a number belongs
    b'{"user":null,"url":"/p/3","ts":1767225600000}',  # a null key
]


def log_with_bad_records(home: Path, lines: list[bytes]) -> list[tuple[int, int]]:
    """Clicks with ``lines`` among them; returns each bad line's (partition, offset)."""
    where = []
    for i, line in enumerate(lines):
        generate(home / "log", "clicks", "clicks", count=6_000, seed=7, users=3_000)
        partition = i % 2
        where.append((partition, partition_path(home / "log", "clicks", partition).stat().st_size))
        append_records(home / "log", "clicks", partition, [line])
    generate(home / "log", "clicks", "clicks", count=6_000, seed=7, users=3_000)
    return where


def test_a_bad_record_fails_the_attempt_with_one_line_naming_it(tmp_path):
    home = tmp_path / "home"
    [(partition, offset)] = log_with_bad_records(home, BAD_LINES[:1])
    for _ in range(2):  # not fixed by a restart: the same record, the same clear error
        assert finish(cutline(home, "run", JOB, *RUN)) == 2
        line = last_line(home)
        report(line)
        assert line.startswith(
            f"cutline: bad record in source 'clicks' partition {partition} at offset {offset}: "
            "not valid JSON"
        )
    attempts = read_delta(home / "warehouse" / "catalog" / "streaming_jobs", JOB).to_pylist()
    assert {a["status"] for a in attempts} == {"FAILED"}
    assert all(f"offset {offset}" in a["failure_reason"] for a in attempts)
    # the job's policy changed to dead-lettering: it goes on from its checkpoint, exactly
    run_to_end(home, "run", JOB, *RUN, "--bad-records", "dead_letter")
    report(check("clicks_per_user", home))
    [dead] = output(home, f"{JOB}_dead_letters").to_dict("records")
    assert (dead["partition"], dead["offset"], dead["raw"]) == (
        partition,
        offset,
        BAD_LINES[0].decode(),
    )


def test_dead_lettered_records_are_committed_once_with_the_output(tmp_path):
    home = tmp_path / "home"
    log_with_bad_records(home, BAD_LINES)
    args = [*RUN, "--bad-records", "dead_letter"]
    killed = cutline(home, "run", JOB, *args, env={KILL_ENV: "sink-committed@3"})
    assert finish(killed) == -9
    run_to_end(home, "run", JOB, *args)
    report(check("clicks_per_user", home))
    dead = output(home, f"{JOB}_dead_letters")
    # each dead letter once, in the epoch its offset fell in
    cuts = job_cuts(home, [JOB, f"{JOB}_dead_letters"])
    expected = cuts.assign(read_log(home, "clicks", bad=True), "clicks")
    report(compare_rows(dead, expected, ["partition", "offset"], ["raw"], "dead letters"))
    assert sorted(dead["reason"]) == sorted(
        ["field 'ts' must be int64, got \"yesterday\"", "null key 'user'"]
        + [r for r in dead["reason"] if r.startswith("not valid JSON")]
    )
    latest = max(completed_checkpoints(home, JOB), key=lambda r: r["checkpoint_id"])
    manifest = CheckpointManifest.from_json(
        (home / "checkpoints" / latest["metadata_path"]).read_bytes()
    )
    assert manifest.counters["bad_records"] == len(BAD_LINES)
    report(f"{len(dead)} bad records dead-lettered once, counted in checkpoint metadata")
