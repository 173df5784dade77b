"""The catalog on S3 (moto's server on loopback) with its writers in separate processes, as a
deployment has them: a driver checkpointing, a GC pass after another, a sensor marking and
recording, the catalog's compaction. Each writer must be shown to have written while the driver
committed (its rounds timed; a registry rewrite of GC wholly inside the driver's commits). No
commit may be lost or doubled and the tables stay readable throughout
(state/storage/tables.py: delta-rs's conditional commits)."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import pytest

from spark_jobs.catalog.delta_catalog import DeltaCatalog
from spark_jobs.catalog.shared_files import RegistryChanges
from spark_jobs.catalog.upkeep import maintain
from state.catalog import CheckpointStatus, CompletedCheckpoint, FencedError
from tests.e2e_util import report

pytestmark = pytest.mark.s3

JOB, OTHER = "clicks", "sessions"
CHECKPOINTS, FILES_PER_CHECKPOINT = 15, 3


def checkpoint(cid: int, attempt: int) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        JOB, cid, cid, attempt, 1000 * cid, 1000 * cid + 50, f"{JOB}/chk-{cid}/_metadata",
        100, 10, FILES_PER_CHECKPOINT, 1.0, 2.0, {"log": {"0": cid}},
    )  # fmt: skip


def shared_files(cid: int) -> list[dict]:
    return [
        {"job_id": JOB, "path": f"shared/op/0/{cid:06d}-{i}.sst", "operator": "op", "subtask": 0,
         "size": 10, "created_by": cid, "last_used": cid, "refcount": 1, "status": "LIVE"}
        for i in range(FILES_PER_CHECKPOINT)
    ]  # fmt: skip


def _write(out: str, result: dict) -> None:
    Path(out).write_text(json.dumps(result))


def driver(root: str, out: str) -> None:
    """A job's driver: begins an attempt, then per checkpoint commits it, registers its new
    shared files and beats."""
    catalog = DeltaCatalog(root)
    attempt = catalog.begin_attempt(JOB, run_id="driver")
    started = time.time()
    for cid in range(1, CHECKPOINTS + 1):
        catalog.commit_checkpoint(checkpoint(cid, attempt))
        catalog.record_shared_files(shared_files(cid))
        catalog.heartbeat(JOB, attempt)
    window = [started, time.time()]
    _write(out, {"attempt": attempt, "conflicts": catalog.conflicts_retried, "window": window})


def gc(root: str, stop: str, out: str) -> None:
    """Retention passes back to back: every LIVE row with refcount 1 gets refcount 2 (a rewrite
    of the registry), every completed checkpoint but the latest becomes SUBSUMED. One more
    pass after ``stop`` appears, so the last one sees everything the driver wrote."""
    catalog = DeltaCatalog(root)
    passes = replans = 0
    finishing = False
    rewrites = []  # (start, end) of each registry rewrite, wall clock
    while True:
        finishing = Path(stop).exists()
        rewrites.append([time.time()])
        result = catalog.update_shared_files(
            JOB,
            lambda rows: RegistryChanges(
                {r["path"]: {"refcount": 2} for r in rows if r["refcount"] == 1}
            ),
        )
        rewrites[-1].append(time.time())
        replans += result.conflicts
        ids = [c.checkpoint_id for c in catalog.checkpoints(JOB, (CheckpointStatus.COMPLETED,))]
        catalog.mark_subsumed(JOB, ids[:-1])
        passes += 1
        if finishing:
            break
    result = {"passes": passes, "replans": replans, "conflicts": catalog.conflicts_retried}
    _write(out, {**result, "spans": rewrites})


def sensor(root: str, stop: str, out: str) -> None:
    """Another job's attempt, beating and recording recoveries, while it reads the first job's
    tables after every write: each read must succeed and never go back in time."""
    catalog = DeltaCatalog(root)
    attempt = catalog.begin_attempt(OTHER, run_id="sensor")
    recoveries = reads = 0
    seen_checkpoints = seen_files = 0
    spans = []  # (start, end) of each round of writes and reads
    while not Path(stop).exists():
        spans.append([time.time()])
        catalog.heartbeat(OTHER, attempt)
        catalog.record_recovery(
            {
                "job_id": OTHER,
                "attempt": attempt,
                "checkpoint_id": recoveries,
                "recovered_at_ms": recoveries,
                "placement": "[]",
            }
        )
        recoveries += 1
        checkpoints, files = len(catalog.checkpoints(JOB)), len(catalog.shared_files(JOB))
        assert checkpoints >= seen_checkpoints and files >= seen_files, "a read went back"
        seen_checkpoints, seen_files = checkpoints, files
        reads += 1
        spans[-1].append(time.time())
    catalog.set_job_status(OTHER, attempt, "FINISHED")
    result = {"recoveries": recoveries, "reads": reads, "conflicts": catalog.conflicts_retried}
    _write(out, {**result, "spans": spans})


def compactor(root: str, stop: str, out: str) -> None:
    """The catalog's compaction (OPTIMIZE, VACUUM, a log checkpoint) over and over."""
    catalog = DeltaCatalog(root)
    rounds, spans = 0, []
    while not Path(stop).exists():
        spans.append([time.time()])
        maintain(catalog)
        spans[-1].append(time.time())
        rounds += 1
    _write(out, {"rounds": rounds, "conflicts": catalog.conflicts_retried, "spans": spans})


def test_concurrent_writers_in_separate_processes_lose_no_commit(s3_root, tmp_path):
    root = f"{s3_root}/catalog"
    DeltaCatalog(root)  # the tables, created once
    stop = str(tmp_path / "stop")
    spawn = multiprocessing.get_context("spawn")
    out = {name: str(tmp_path / f"{name}.json") for name in ("driver", "gc", "sensor", "compact")}
    others = [
        spawn.Process(target=gc, args=(root, stop, out["gc"])),
        spawn.Process(target=sensor, args=(root, stop, out["sensor"])),
        spawn.Process(target=compactor, args=(root, stop, out["compact"])),
    ]
    started = time.monotonic()
    for p in others:
        p.start()
    job = spawn.Process(target=driver, args=(root, out["driver"]))
    job.start()
    job.join(600)
    Path(stop).touch()
    for p in others:
        p.join(600)
    assert [p.exitcode for p in [job, *others]] == [0, 0, 0, 0]
    results = {name: json.loads(Path(path).read_text()) for name, path in out.items()}
    # the writers overlapped: each wrote while the driver committed (a registry rewrite of GC
    # began and ended inside the driver's commits, so appends landed before and after it)
    first, last = results["driver"].pop("window")
    spans = {name: results[name].pop("spans") for name in ("gc", "sensor", "compact")}
    during = {
        name: sum(1 for s in done if len(s) == 2 and s[0] < last and s[1] > first)
        for name, done in spans.items()
    }
    assert all(during.values()), f"writers that never overlapped the driver's commits: {during}"
    inside = sum(1 for s in spans["gc"] if len(s) == 2 and first < s[0] and s[1] < last)
    assert inside >= 1, "no registry rewrite began and ended while the driver appended"
    results["overlapping the driver's commits"] = {**during, "gc rewrites within": inside}

    catalog = DeltaCatalog(root)
    checkpoints = catalog.checkpoints(JOB)
    assert [c.checkpoint_id for c in checkpoints] == list(range(1, CHECKPOINTS + 1))
    assert [c.status for c in checkpoints] == [CheckpointStatus.SUBSUMED] * (CHECKPOINTS - 1) + [
        CheckpointStatus.COMPLETED
    ]
    files = catalog.shared_files(JOB)
    expected = sorted(f["path"] for cid in range(1, CHECKPOINTS + 1) for f in shared_files(cid))
    assert sorted(f["path"] for f in files) == expected  # none lost, none doubled
    assert {f["refcount"] for f in files} == {2}  # every rewrite's change landed
    attempt = results["driver"]["attempt"]
    [beat] = [r for r in catalog.jobs(JOB) if r["attempt"] == attempt]
    assert beat["status"] == "RUNNING" and beat["last_heartbeat_ms"] >= beat["started_ms"]
    assert len(catalog.recoveries(OTHER)) == results["sensor"]["recoveries"]
    assert catalog.jobs(OTHER)[-1]["status"] == "FINISHED"
    with pytest.raises(FencedError):  # the fence held throughout: a newer attempt fences it
        catalog.begin_attempt(JOB)
        catalog.commit_checkpoint(checkpoint(CHECKPOINTS + 1, attempt))
    report(
        f"catalog on S3, 4 writing processes, {time.monotonic() - started:.1f} s: "
        + json.dumps(results, sort_keys=True)
    )


def lost_answers_writer(root: str, out: str) -> None:
    """Begins an attempt, commits three checkpoints and their files, beats, subsumes, and
    commits two epochs to a sink, every log entry's first answer lost on the way."""
    import pyarrow as pa

    from cutline.sinks.delta import DeltaSinkWriter

    catalog = DeltaCatalog(f"{root}/catalog")
    attempt = catalog.begin_attempt(JOB, run_id="lost answers")
    for cid in (1, 2, 3):
        catalog.commit_checkpoint(checkpoint(cid, attempt))
        catalog.record_shared_files(shared_files(cid))
        catalog.heartbeat(JOB, attempt)
    catalog.mark_subsumed(JOB, [1, 2])
    sink = DeltaSinkWriter(JOB, "out", "out", f"{root}/tables", f"{root}/staging", attempt)
    sink.fence()
    ends = {e: {"log": {"0": e}} for e in (0, 1)}
    for epoch in (0, 1):
        sink.staged.write(epoch, "part-00000", pa.table({"user": [f"u{epoch}"]}))
        rows = sink.commit_through(epoch, ends)
    _write(out, {"attempt": attempt, "last_rows": rows, "epoch": sink.committed_epoch()})


def test_commits_whose_answers_were_lost_land_once(s3_server, s3_bucket, tmp_path):
    """The S3 server stores each commit's log entry and the proxy loses the answer (a 503): the
    writer's retry finds the entry taken. Every conditional commit recognises its own commit by
    its token and is not made again, and the blind appends and updates stay single: one
    attempt, each checkpoint and file once, each epoch's rows once."""
    from spark_jobs.catalog.tables import read_delta
    from state.storage.tables import table_uri
    from tests.s3_proxy import LOSE, PASS, FaultyProxy

    lost: set[str] = set()

    def plan(method: str, path: str, n: int) -> tuple[str, float]:
        entry = path.split("?")[0]
        first_answer = "/_delta_log/" in entry and entry.endswith(".json") and entry not in lost
        if method == "PUT" and first_answer and not entry.endswith("/00000000000000000000.json"):
            lost.add(entry)
            return LOSE, 0.0
        return PASS, 0.0

    root = f"s3://{s3_bucket}"
    out = str(tmp_path / "writer.json")
    with FaultyProxy(s3_server, plan) as proxy:
        # the writer runs in its own process: delta-rs holds this one's interpreter while it
        # waits for the proxy, which is Python
        spawn = multiprocessing.get_context("spawn")
        with pytest.MonkeyPatch.context() as env:
            env.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
            writer = spawn.Process(target=lost_answers_writer, args=(root, out))
            writer.start()
        writer.join(300)
    assert writer.exitcode == 0
    result = json.loads(Path(out).read_text())
    assert len(lost) >= 10, sorted(lost)

    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL_S3", s3_server)
        catalog = DeltaCatalog(f"{root}/catalog")
        assert [r["attempt"] for r in catalog.jobs(JOB)] == [1] == [result["attempt"]]
        checkpoints = catalog.checkpoints(JOB)
        assert [c.checkpoint_id for c in checkpoints] == [1, 2, 3]
        assert [c.status for c in checkpoints] == [CheckpointStatus.SUBSUMED] * 2 + [
            CheckpointStatus.COMPLETED
        ]
        paths = sorted(f["path"] for f in catalog.shared_files(JOB))
        assert paths == sorted(f["path"] for cid in (1, 2, 3) for f in shared_files(cid))
        rows = read_delta(table_uri(f"{root}/tables", "out")).to_pylist()
        assert sorted((r["user"], r["_epoch"]) for r in rows) == [("u0", 0), ("u1", 1)]
        assert result["epoch"] == 1
    report(f"lost answers: {len(lost)} log entries stored with their answers lost; none doubled")
