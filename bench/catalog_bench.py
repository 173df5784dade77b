"""Catalog cost against the length of a job's history: requests and seconds per checkpoint
commit, per start and per GC pass at 10, 100, 1,000 and 10,000 completed checkpoints, on local
disk and on the S3 server (moto on 127.0.0.1, every request counted from its log), side by side
in one invocation.

A real run of ``clicks_per_user`` (two micro-batches, so two real checkpoints and a real catalog)
starts each storage's history; the history then grows as a running driver grows it, one checkpoint
at a time: the subtasks' private files uploaded under the new checkpoint's directory and its
manifest written (copies of the real latest one's, so every checkpoint restores), the row committed
under the attempt's fence, the checkpoint beyond the retained ones marked SUBSUMED, and every ten
checkpoints a heartbeat and the driver's upkeep (``compact_job``), every hundred a GC pass as the
schedule makes them (the checkpoints' garbage would otherwise fill the bucket; ``bucket_keys``
says what it holds: the catalog's removed data files stay until the scheduled VACUUM, a week by
default, and the log for its hour; the S3 server lists from key names, tests/moto_serving.py).
Past ``--real-up-to`` checkpoints the rows are imported in bulk instead (``import_checkpoints``,
a thousand a commit, SUBSUMED, their manifests not written): the tables hold the whole history,
the log only the commits made. At each size:

- commit: a warm catalog (a running driver's) completing ``--commits`` more checkpoints, each the
  private files' and the manifest's PUTs and the two catalog commits; the median per checkpoint;
- start: a cold catalog planning an attempt's start (``plan_start``: the attempt begun and
  fenced, the sink fenced, the root checked, the latest checkpoint chosen and validated), as a
  new driver's plan thread does; the median of ``--starts``, each after one more checkpoint
  (a cold open replays the log's commits since its last log checkpoint, zero to nine);
- gc: one ``cutline gc`` pass (no grace).

    .venv/bin/python bench/catalog_bench.py --sizes 10 100 1000 10000

Prints a line per size and storage and writes bench/results/catalog.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import boto3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spark_jobs.catalog import delta_catalog  # noqa: E402
from spark_jobs.catalog.delta_catalog import DeltaCatalog  # noqa: E402
from spark_jobs.catalog.tables import now_ms  # noqa: E402
from spark_jobs.catalog.upkeep import compact_job  # noqa: E402
from spark_jobs.deploy.settings import RuntimePaths  # noqa: E402
from spark_jobs.driver.attempt_start import plan_start  # noqa: E402
from spark_jobs.job_loader import get_job  # noqa: E402
from spark_jobs.maintenance.gc import collect_garbage  # noqa: E402
from spark_jobs.sources.generate import generate  # noqa: E402
from state.catalog import CheckpointStatus, CompletedCheckpoint  # noqa: E402
from state.manifest import CheckpointManifest  # noqa: E402
from state.paths import JobLayout  # noqa: E402
from state.storage import open_storage  # noqa: E402
from tests.moto_server import MotoServer  # noqa: E402

JOB = "clicks_per_user"
LAYOUT = JobLayout(JOB)
# a request line of the server's log; werkzeug colours some (ANSI codes before the method)
REQUEST = re.compile(rb'"(?:\x1b\[[0-9;]*m)*(?:GET|PUT|POST|HEAD|DELETE) \S+ HTTP')
IMPORT_CHUNK = 1000
GC_EVERY = 100  # checkpoints grown between GC passes


class Requests:
    """Requests the S3 server answered, from its log; always 0 on local disk."""

    def __init__(self, log: Path | None) -> None:
        self.log = log

    def count(self) -> int:
        if self.log is None:
            return 0
        return len(REQUEST.findall(self.log.read_bytes()))


class History:
    """One job's catalog and checkpoint storage, grown one checkpoint at a time as a driver
    grows them (see the module docstring)."""

    def __init__(self, paths: RuntimePaths, requests: Requests) -> None:
        self.paths, self.requests = paths, requests
        self.storage = open_storage(paths.checkpoint_root)
        self.catalog = DeltaCatalog(paths.catalog)
        self.job = get_job(JOB)
        [latest] = self.catalog.checkpoints(JOB, (CheckpointStatus.COMPLETED,))[-1:]
        self.template = json.loads(self.storage.get_bytes(latest.metadata_path))
        self.last = latest.checkpoint_id
        self.private_prefix = f"chk-{self.last}/"
        self.private = {  # the subtasks' private files: each checkpoint uploads its own copy
            f["path"]: self.storage.get_bytes(LAYOUT.job_path(f["path"]))
            for s in self.template["subtasks"]
            for f in s["files"]
            if f["path"].startswith(self.private_prefix)
        }
        self.attempt = self.catalog.begin_attempt(JOB, run_id="catalog-bench")
        self.retained = self.job.checkpoint.num_retained

    def _row(self, cid: int, status=CheckpointStatus.COMPLETED) -> CompletedCheckpoint:
        at = now_ms()
        return CompletedCheckpoint(
            JOB, cid, cid, self.attempt, at - 500, at, LAYOUT.job_path(LAYOUT.metadata(cid)),
            1 << 20, 1 << 16, 8, 5.0, 50.0, status=status,
        )  # fmt: skip

    def complete_one(self) -> None:
        """Checkpoint ``last + 1`` completed as the coordinator completes one."""
        cid = self.last + 1
        own = f"chk-{cid}/"
        for path, data in self.private.items():
            self.storage.put_bytes(LAYOUT.job_path(own + path[len(self.private_prefix) :]), data)
        doc = json.dumps({**self.template, "checkpoint_id": cid, "attempt": self.attempt})
        manifest = CheckpointManifest.from_json(
            doc.replace(f'"{self.private_prefix}', f'"{own}').encode()
        )
        self.storage.put_bytes(LAYOUT.job_path(LAYOUT.metadata(cid)), manifest.to_json())
        self.catalog.commit_checkpoint(self._row(cid))
        if cid - self.retained > 0:
            self.catalog.mark_subsumed(JOB, [cid - self.retained])
        self.last = cid
        if cid % 10 == 0:  # the heartbeat thread's beat and upkeep
            self.catalog.heartbeat(JOB, self.attempt)
            compact_job(self.catalog, JOB)

    def grow_to(self, size: int, real_up_to: int) -> None:
        while self.last < min(size, real_up_to):
            self.complete_one()
            if self.last % GC_EVERY == 0:  # the scheduled GC: the bucket holds what is live
                collect_garbage(JOB, self.paths, grace_s=0, log=lambda *_: None)
        if self.last < size - self.retained:  # the retained ones are about to be subsumed
            retained = range(max(1, self.last - self.retained + 1), self.last + 1)
            self.catalog.mark_subsumed(JOB, list(retained))
        while self.last < size - self.retained:  # the rest in bulk, all subsumed
            upto = min(self.last + IMPORT_CHUNK, size - self.retained)
            rows = [self._row(c, CheckpointStatus.SUBSUMED) for c in range(self.last + 1, upto + 1)]
            self.catalog.import_checkpoints(rows)
            self.last = upto
        while self.last < size:
            self.complete_one()

    def measure(self, commits: int, starts: int) -> dict:
        """The figures at the current size (module docstring)."""
        keys = self.bucket_keys()
        per_commit = []
        for _ in range(commits):
            before, started = self.requests.count(), time.perf_counter()
            self.complete_one()
            per_commit.append((time.perf_counter() - started, self.requests.count() - before))
        per_start = []
        for _ in range(starts):  # each after one more checkpoint: where the log is between its
            delta_catalog._EXISTING.clear()  # checkpoints varies; a new driver has seen no table
            before, started = self.requests.count(), time.perf_counter()
            plan = plan_start(
                DeltaCatalog(self.paths.catalog),
                open_storage(self.paths.checkpoint_root),
                self.job,
                self.paths,
                "latest",
                "catalog-bench",
                log=lambda *_: None,
            )
            per_start.append((time.perf_counter() - started, self.requests.count() - before))
            assert plan.manifest is not None and plan.manifest.checkpoint_id == self.last
            self.catalog.set_job_status(JOB, plan.attempt, "FINISHED")
            self.attempt = self.catalog.begin_attempt(JOB, run_id="catalog-bench")  # the driver
            self.complete_one()
        before, started = self.requests.count(), time.perf_counter()
        report = collect_garbage(JOB, self.paths, grace_s=0, log=lambda *_: None)
        gc = (time.perf_counter() - started, self.requests.count() - before)
        return {
            "checkpoints": self.last,
            "commit_s": round(statistics.median(s for s, _ in per_commit), 4),
            "commit_requests": statistics.median(n for _, n in per_commit),
            "start_s": round(statistics.median(s for s, _ in per_start), 3),
            "start_requests": statistics.median(n for _, n in per_start),
            "gc_s": round(gc[0], 3),
            "gc_requests": gc[1],
            "gc_files_deleted": report.files_deleted,
            "bucket_keys": keys,
        }

    def bucket_keys(self) -> int | None:
        """Keys in the S3 bucket when the commits are measured (None on local disk): the
        server's LIST walks them all, S3's does not (module docstring)."""
        if not self.paths.catalog.startswith("s3://"):
            return None
        return sum(1 for _ in open_storage("s3://" + self.paths.catalog.split("/")[2]).list())


def first_run(home: Path, paths: RuntimePaths, env: dict[str, str]) -> None:
    """A real run of the job: two micro-batches, two checkpoints, the catalog made."""
    generate(home / "log", "clicks", "clicks", count=4_000, seed=7, users=500)
    roles = ["--checkpoint-root", paths.checkpoint_root, "--warehouse", paths.warehouse]
    run = [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), "run", JOB, *roles]
    run += ["--interval-ms", "200", "--max-batches", "2", "--max-records-per-partition", "1000"]
    subprocess.run(run, env={**os.environ, **env}, check=True, capture_output=True, cwd=ROOT)


def bench(name: str, home: Path, paths: RuntimePaths, env: dict, requests: Requests, args) -> list:
    first_run(home, paths, env)
    history, rows = History(paths, requests), []
    for size in args.sizes:
        started = time.perf_counter()
        history.grow_to(size - args.commits - args.starts, args.real_up_to)
        grown = time.perf_counter() - started
        measured = history.measure(args.commits, args.starts)
        row = {"storage": name, **measured, "grow_s": round(grown, 1)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--commits", type=int, default=5, help="measured per size")
    parser.add_argument("--starts", type=int, default=5, help="measured per size")
    parser.add_argument("--real-up-to", type=int, default=1000, help="grown commit by commit")
    parser.add_argument("--storage", nargs="+", default=["local", "s3"])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "catalog.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cutline-catalog-bench-"))
    results = []
    try:
        if "local" in args.storage:
            home = work / "local"
            results += bench("local", home, RuntimePaths.under(home), {}, Requests(None), args)
        if "s3" in args.storage:
            server = MotoServer(work / "moto.log").start()
            env = {
                "AWS_ENDPOINT_URL": server.endpoint,
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_DEFAULT_REGION": "us-east-1",
            }
            os.environ.update(env)  # this process's catalog and storage too (no thread yet)
            bucket = f"catalog-bench-{uuid.uuid4().hex[:8]}"
            boto3.client("s3", endpoint_url=server.endpoint).create_bucket(Bucket=bucket)
            home = work / "s3"
            base = RuntimePaths.under(home)
            paths = RuntimePaths(
                f"s3://{bucket}/chk", f"s3://{bucket}/wh", base.local_state_root, base.log_root
            )
            try:
                results += bench("s3", home, paths, env, Requests(server.log_path), args)
            finally:
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {
        "what": "catalog cost against history: clicks_per_user, 2 subtasks, 2 retained",
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "real_up_to": args.real_up_to,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
