"""Peer benchmark: one stateful workload run six ways on the same input and machine.

The workload keeps, per user, the event count, the amount sum and the latest 100-byte payload
(by event time), over events that Cutline and Spark read from the local log (Arrow segments, or
JSON lines with ``--log-format jsonl``) through the same Python data source (``cutline_log``) and
Flink from the same records as JSON files, with parallelism 2 on 2 cores:

- ``cutline``: the ``user_activity`` job (``cutline run``): Arrow batches and RocksDB per subtask,
  checkpoints every 3 s with task-local recovery, output to Delta exactly once; retention GC
  (``cutline gc --grace-s G``) runs every ``--gc-every-s`` during the sustained phase, as its
  schedule would;
- ``spark_python``: Spark's first Python stateful API (``applyInPandasWithState``);
- ``spark_tws``: Spark 4's Python stateful API (``transformWithStateInPandas``, one value state
  per user);
- ``spark_sql``: native ``groupBy().agg(count, sum, max_by(payload, ts), max(ts))``;
- ``flink_sql``: Flink 2.3 SQL ``GROUP BY`` (bench/peer_flink.py, in ``.venv-flink``), RocksDB
  with incremental checkpoints every 3 s, its updates written exactly-once by the filesystem
  sink (Debezium JSON); ``flink_blackhole``: the same into Flink's blackhole sink.

The Spark variants (bench/peer_spark.py) use the RocksDB state store provider with changelog
checkpointing, and write their updates to Delta through ``foreachBatch`` (idempotent by
``txnVersion``). The input is bench/peer_input.py's; the report, bench/peer_report.py's. Flink's
"micro-batches" are its completed checkpoints (the records its source read since the previous
one): its sink commits at checkpoints, as Cutline's and Spark's at micro-batches.

For each state size (``--sizes``, MiB of logical state: keys times ``--bytes-per-key``, the key
and value bytes of one user; checkpoints are larger by RocksDB's space amplification), in a fresh
copy of the input per system:

1. throughput: a backlog of every key once (the fill) and then ``--steady`` x keys uniformly
   random records, consumed at full speed. Steady state: the micro-batches after the fill.
   Records/s is end to end (records over wall time between batch completions); micro-batch
   durations are the intervals between completions.
2. sustained: for the rest of ``--minutes``, records are appended at ``--rate`` per second. The
   checkpoint directory (Cutline: checkpoints and catalog) is scanned every 2 s: bytes written
   (every distinct file seen, at its largest) per minute, and total storage at the end; each
   checkpoint's upload against the full state (Cutline: its catalog; Flink: its REST API), and
   the peak memory (RSS, and anonymous) of the driver's process group (JVM and Python workers).
3. restart: ``kill -9`` of the driver's process group, one micro-batch of new records, the same
   command again: seconds from the process start, and from Spark's first log line (the JVM is
   up: the same point in every system), to the first completed micro-batch with records.
4. takeover (Cutline): ``cutline run --standby`` on the same state; once its standby is warm,
   ``kill -9`` of the active driver's process group and one micro-batch of new records: seconds
   from the kill to the standby's first completed micro-batch with records.

The Python API variants run their throughput phase for at most ``--python-minutes`` with
micro-batches of ``--python-batch-records`` and skip the sustained phase (they cannot keep up).

    .venv/bin/python bench/peer_bench.py --sizes 100 1024
Writes bench/results/peer.json, peer.md and the PNG plots.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.peer_flink import JVM_UP as FLINK_JVM_UP  # noqa: E402
from bench.peer_input import (  # noqa: E402
    FORMATS,
    PARTITIONS,
    Appender,
    FileDrop,
    Write,
    build_input,
    log_writer,
)
from bench.peer_report import write_report  # noqa: E402
from bench.peer_spark import EVENT  # noqa: E402

RESULTS = ROOT / "bench" / "results"
JOB = "user_activity"
SYSTEMS = ("cutline", "spark_sql", "flink_sql", "flink_blackhole", "spark_python", "spark_tws")
FLINK = {"flink_sql": "files", "flink_blackhole": "blackhole"}  # system: bench/peer_flink.py's sink
FLINK_PYTHON = ROOT / ".venv-flink" / "bin" / "python"  # PyFlink pins its own dependencies
PYTHON_APIS = ("spark_python", "spark_tws")  # Spark's Python stateful APIs: short runs
JVM_UP = ("To adjust logging level use sc.setLogLevel", FLINK_JVM_UP)  # the JVM is up


# ---------------------------------------------------------------- storage


class StorageWatch(threading.Thread):
    """Scans directories every ``every_s``: every distinct file at its largest size seen
    (bytes written, a lower bound) and what is stored now; and the peak resident and anonymous
    memory of the process groups in ``groups``."""

    def __init__(self, roots: list[Path], every_s: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.roots, self.every_s = roots, every_s
        self.groups: set[int] = set()
        self.peak_rss = 0
        self.peak_anon = 0
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.started = time.monotonic()
        self.samples: list[tuple[float, int]] = []  # (seconds since start, bytes stored)

    def scan(self) -> int:
        stored = 0
        for root in self.roots:
            for dirpath, _, files in os.walk(root):
                for name in files:
                    path = os.path.join(dirpath, name)
                    try:
                        size = os.stat(path).st_size
                    except FileNotFoundError:
                        continue
                    stored += size
                    with self.lock:
                        self.seen[path] = max(size, self.seen.get(path, 0))
        return stored

    def written(self) -> int:
        with self.lock:
            return sum(self.seen.values())

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            resident, anonymous = group_memory(self.groups)
            self.peak_rss = max(self.peak_rss, resident)
            self.peak_anon = max(self.peak_anon, anonymous)
            stored = self.scan()
            now = time.monotonic() - self.started
            if not self.samples or now - self.samples[-1][0] >= 30:
                self.samples.append((round(now), stored))


def group_memory(groups: set[int]) -> tuple[int, int]:
    """Resident and anonymous bytes of every process in the process groups ``groups``, from
    /proc. Resident memory counts the page cache a process maps (a memory-mapped store's blocks)
    once per process that touched it; anonymous memory is the processes' own."""
    resident = anonymous = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) not in groups:  # pgrp
                continue
            status = (stat.parent / "status").read_text()
        except OSError:  # gone
            continue
        kib = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        resident += int(kib.get("VmRSS", "0 kB").split()[0]) * 1024
        anonymous += int(kib.get("RssAnon", "0 kB").split()[0]) * 1024
    return resident, anonymous


# ---------------------------------------------------------------- drivers


@dataclass
class Batch:
    end: float  # monotonic seconds at completion
    records: int
    uploaded: int | None = None  # Flink: the bytes its checkpoint uploaded, of
    full: int | None = None  # its full state
    ms: float | None = None  # Flink: the checkpoint's end-to-end duration


@dataclass
class Driver:
    """One driver process of a system and the micro-batches it reported."""

    proc: subprocess.Popen
    started: float
    batches: list[Batch] = field(default_factory=list)
    jvm_up: float | None = None  # when Spark's first log line came (the same in every system)
    last_event: dict = field(default_factory=dict)
    startup: dict = field(default_factory=dict)  # Cutline's startup phases (s), latest attempt
    active: int | None = None  # under a standby supervisor: the active driver's pid
    warm: threading.Event = field(default_factory=threading.Event)  # a standby is warm

    def records(self) -> int:
        return sum(b.records for b in self.batches)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)


def start_driver(
    system: str, home: Path, batch_records: int, *more: str, root: Path = ROOT
) -> Driver:
    """Starts one driver of ``system`` on ``home`` in its own process group, with ``more``
    arguments (Cutline: of ``cutline run``; Flink: of bench/peer_flink.py). ``root``: the
    checkout whose Cutline runs (another commit's worktree, to compare two)."""
    env = {**os.environ, "CUTLINE_EVENTS": "stdout", "PYTHONUNBUFFERED": "1"}
    if root != ROOT:
        env["PYTHONPATH"] = str(root)
    if system == "cutline":
        cmd = [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), "run", JOB,
               "--master", "local[2]",
               "--max-records-per-partition", str(batch_records), *more]  # fmt: skip
    elif system in FLINK:
        cmd = [str(FLINK_PYTHON), str(ROOT / "bench" / "peer_flink.py"), FLINK[system],
               str(home), "--rest-port", str(free_port()), *more]  # fmt: skip
    else:
        cmd = [sys.executable, str(ROOT / "bench" / "peer_spark.py"), system, str(home),
               "--batch-records", str(batch_records)]  # fmt: skip
    log = open(home / "driver.log", "ab")  # noqa: SIM115 - owned by the reader thread
    proc = subprocess.Popen(
        cmd,
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    driver = Driver(proc, time.monotonic())

    def read() -> None:
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            log.write(b"%8.2f " % (time.monotonic() - driver.started) + raw)
            if driver.jvm_up is None and any(m in line for m in JVM_UP):
                driver.jvm_up = time.monotonic()
            if "warm, waiting" in line:  # a standby driver's
                driver.warm.set()
            event = None
            if line.startswith("CUTLINE_EVENT "):
                event = json.loads(line[len("CUTLINE_EVENT ") :])
                if event.get("kind") == "startup":
                    driver.startup = {k: v for k, v in event.items() if k != "kind"}
                if event.get("kind") == "drivers":
                    driver.active = event["active"]
                event = event if event.get("kind") == "batch" else None
            elif line.startswith(EVENT):
                event = json.loads(line[len(EVENT) :])
            if event is not None:
                driver.batches.append(
                    Batch(
                        time.monotonic(),
                        int(event["records"]),
                        event.get("uploaded_bytes"),
                        event.get("state_bytes"),
                        event.get("ms"),
                    )
                )
                driver.last_event = event
        log.close()

    threading.Thread(target=read, daemon=True).start()
    return driver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_input(system: str, base: Path, home: Path) -> Write:
    """A fresh copy of the input ``base`` for ``system`` in ``home``; returns its writer."""
    if system in FLINK:
        drop = FileDrop(home / "files")
        drop.copy_log(base)
        return drop
    shutil.copytree(base, home / "log")
    return log_writer(home / "log")


def wait_until(predicate, deadline: float, driver: Driver, what: str) -> bool:
    """Polls ``predicate`` until the monotonic ``deadline``; False when it passed."""
    while time.monotonic() < deadline:
        if predicate():
            return True
        if driver.proc.poll() is not None:
            raise RuntimeError(f"the driver exited ({driver.proc.returncode}) waiting for {what}")
        time.sleep(0.2)
    return False


def start_gc(home: Path, grace_s: float) -> subprocess.Popen:
    """One retention GC pass (``cutline gc``), as the retention schedule would launch it."""
    cmd = [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), "gc", JOB,
           "--grace-s", str(grace_s), "--json"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def throughput(batches: list[Batch], after_records: int) -> dict:
    """End-to-end records/s and batch intervals over the batches after the first
    ``after_records`` records (and never the first two: JVM and worker warm-up)."""
    seen, first = 0, None
    for i, b in enumerate(batches):
        if seen >= after_records and i >= 2:
            first = i
            break
        seen += b.records
    if first is None or first >= len(batches):
        return {"records_per_s": None, "steady_batches": 0}
    steady = batches[first:]
    wall = steady[-1].end - batches[first - 1].end
    intervals = [(b.end - a.end) * 1000 for a, b in zip(batches[first - 1 :], steady, strict=False)]
    records = sum(b.records for b in steady)
    return {
        "records_per_s": round(records / wall) if wall > 0 else None,
        "steady_batches": len(steady),
        "steady_records": records,
        "batch_ms_p50": pct(intervals, 50),
        "batch_ms_p99": pct(intervals, 99),
    }


def bench_system(
    system: str, home: Path, write: Write, keys: int, backlog: int, ts: int, args
) -> dict:
    python_api = system in PYTHON_APIS
    batch_records = args.python_batch_records if python_api else args.batch_records
    watch_roots = [home / "checkpoints"] + (
        [home / "warehouse" / "catalog"] * (system == "cutline")
    )
    watch = StorageWatch(watch_roots)
    watch.start()
    appender = Appender(write, keys, args.rate, ts, seed=11)
    out: dict = {"system": system, "batch_records_per_partition": batch_records}
    more = ("--managed-mib", str(args.flink_managed_mib)) if system in FLINK else ()
    driver = start_driver(system, home, batch_records, *more)
    watch.groups.add(driver.proc.pid)
    restarted: Driver | None = None
    limit = args.python_minutes if python_api else args.minutes
    end = driver.started + limit * 60
    try:
        # 1. throughput: the backlog at full speed
        drained = wait_until(lambda: driver.records() >= backlog, end, driver, "the backlog")
        out["throughput_phase_s"] = round(time.monotonic() - driver.started, 1)
        out["backlog_drained"] = drained
        out["records_in_throughput_phase"] = driver.records()
        out.update(throughput(list(driver.batches), min(keys, driver.records() // 3)))
        out["fill_completed"] = driver.records() >= keys
        # 2. sustained: appends at --rate until --minutes, GC on its schedule (Cutline)
        written_before = watch.written()
        sustained_from, sustained_from_ms = time.monotonic(), time.time() * 1000
        gcs, gc = 0, None
        if not python_api:
            appender.start()
            next_gc = time.monotonic() + args.gc_every_s
            while time.monotonic() < end:
                if driver.proc.poll() is not None:
                    raise RuntimeError(f"{system} exited ({driver.proc.returncode})")
                if gc is not None and gc.poll() is not None:
                    if gc.returncode != 0:
                        raise RuntimeError(f"cutline gc exited {gc.returncode}")
                    gc, gcs = None, gcs + 1
                if system == "cutline" and gc is None and time.monotonic() >= next_gc:
                    gc = start_gc(home, args.gc_grace_s)
                    next_gc = time.monotonic() + args.gc_every_s
                time.sleep(0.5)
            appender.stopped.set()
            appender.join()
            if system == "cutline":  # the schedule's pass at the end of the window
                if gc is not None:
                    gc.wait()
                if start_gc(home, args.gc_grace_s).wait() != 0:
                    raise RuntimeError("cutline gc failed")
                gcs += 1 + (gc is not None)
            minutes = (time.monotonic() - sustained_from) / 60
            out["sustained_minutes"] = round(minutes, 2)
            out["sustained_records"] = appender.appended
            out["sustained_behind_records"] = backlog + appender.appended - driver.records()
            sustained = appender.appended > 0 and minutes > 0  # not when the backlog took it all
            out["bytes_written_per_min"] = (
                round((watch.written() - written_before) / minutes) if sustained else None
            )
            out["gc_passes"] = gcs
            out.update(uploads(system, home, driver, sustained_from, sustained_from_ms))
        out["run_minutes"] = round((time.monotonic() - driver.started) / 60, 2)
        out["storage_bytes_end"] = watch.scan()
        out["storage_bytes_every_30s"] = [b for _, b in watch.samples]
        out["bytes_written_total"] = watch.written()
        out["peak_rss_bytes"] = watch.peak_rss
        out["peak_anon_bytes"] = watch.peak_anon
        out["batches"] = len(driver.batches)
        out["last_batch"] = driver.last_event
        if system == "cutline":
            out["state_bytes"] = max((r.full_size for r in cutline_checkpoints(home)), default=None)
        elif system in FLINK:
            out["state_bytes"] = max((b.full for b in driver.batches if b.full), default=None)
        # 3. restart: kill -9, one micro-batch of new records, the same command again
        driver.kill()
        appender.append(batch_records * PARTITIONS)
        restarted = start_driver(system, home, batch_records, *more)
        watch.groups.add(restarted.proc.pid)
        got = wait_until(
            lambda: any(b.records for b in restarted.batches),
            restarted.started + 600,
            restarted,
            "the first micro-batch after the restart",
        )
        first = next((b for b in restarted.batches if b.records), None)
        out["restart_to_first_batch_s"] = round(first.end - restarted.started, 2) if got else None
        if got and restarted.jvm_up is not None:
            out["restart_after_jvm_up_s"] = round(first.end - restarted.jvm_up, 2)
        if restarted.startup:
            out["restart_phases_s"] = restarted.startup
        time.sleep(args.after_restart_s)
        after = throughput(list(restarted.batches), 0)
        out["after_restart_batch_ms_p50"] = after.get("batch_ms_p50")
        restarted.kill()
        if system == "cutline":  # 4. the same restart as a warm standby's takeover
            restarted = start_driver(system, home, batch_records, "--standby")
            out.update(takeover(restarted, appender, batch_records))
            restarted.kill()
    finally:
        appender.stopped.set()
        watch.stopped.set()
        for d in (driver, restarted):
            if d is not None and d.proc.poll() is None:
                d.kill()
    return out


def uploads(system: str, home: Path, driver: Driver, since: float, since_ms: float) -> dict:
    """Bytes each checkpoint of the sustained phase uploaded, p50 and p95, and the full state
    (Cutline: its catalog's rows; Flink: its driver's lines; Spark: not reported)."""
    sustained = [b for b in driver.batches if b.end >= since]
    if system == "cutline":
        rows = cutline_checkpoints(home)
        pairs = [(r.incremental_size, r.full_size) for r in rows if r.complete_time_ms >= since_ms]
    else:
        pairs = [(b.uploaded, b.full) for b in sustained if b.full]
    if not pairs:
        return {}
    up = [float(u) for u, _ in pairs]
    out = {
        "checkpoints_sustained": len(pairs),
        "upload_bytes_p50": pct(up, 50),
        "upload_bytes_p95": pct(up, 95),
        "full_state_bytes_max": max(f for _, f in pairs),
    }
    if system in FLINK:  # its checkpoints' own durations, beside their intervals
        durations = [b.ms for b in sustained if b.ms is not None]
        out.update(checkpoint_ms_p50=pct(durations, 50), checkpoint_ms_p99=pct(durations, 99))
    return out


def takeover(run: Driver, appender: Appender, batch_records: int, idle_s: float = 2.0) -> dict:
    """``cutline run --standby`` (started): ``idle_s`` after its standby is warm, ``kill -9`` of
    the active driver's process group and one micro-batch of new records; seconds from the kill
    to the replacing attempt's first completed micro-batch with records, and its phases."""
    deadline = run.started + 600
    wait_until(lambda: run.warm.is_set() and run.active, deadline, run, "a warm standby")
    time.sleep(idle_s)
    seen, before = len(run.batches), run.startup
    killed = time.monotonic()
    os.killpg(run.active, signal.SIGKILL)
    appender.append(batch_records * PARTITIONS)
    got = wait_until(
        lambda: any(b.records for b in run.batches[seen:]),
        killed + 600,
        run,
        "the takeover's first micro-batch",
    )
    first = next((b for b in run.batches[seen:] if b.records), None)
    wait_until(lambda: run.startup is not before, time.monotonic() + 30, run, "its phases")
    return {
        "takeover_to_first_batch_s": round(first.end - killed, 2) if got else None,
        "takeover_phases_s": run.startup,
    }


def cutline_checkpoints(home: Path) -> list:
    """Every checkpoint Cutline's catalog recorded as completed, retained or subsumed since."""
    from spark_jobs.catalog.tables import CatalogReader
    from state.catalog import CheckpointStatus

    catalog = home / "warehouse" / "catalog"  # the catalog's default root under the warehouse
    statuses = (CheckpointStatus.COMPLETED, CheckpointStatus.SUBSUMED)
    return CatalogReader(str(catalog)).checkpoints(JOB, statuses)


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1024], help="MiB")
    parser.add_argument(
        "--bytes-per-key", type=int, default=150, help="logical state per key: key and value"
    )
    parser.add_argument("--steady", type=float, default=1.0, help="x keys after the fill")
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default="arrow",
        help="the local log's, read by Cutline "
        "and Spark (Flink reads the same records as JSON files)",
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=20_000, help="records/s, sustained phase")
    parser.add_argument("--batch-records", type=int, default=100_000, help="per partition")
    parser.add_argument("--python-minutes", type=float, default=3.0)
    parser.add_argument("--python-batch-records", type=int, default=5_000)
    parser.add_argument("--gc-every-s", type=float, default=60.0)
    parser.add_argument("--gc-grace-s", type=float, default=60.0, help="cutline gc --grace-s")
    parser.add_argument("--after-restart-s", type=float, default=20.0)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument(
        "--flink-managed-mib", type=int, default=256, help="Flink's RocksDB memory, both slots"
    )
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the report goes")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the figures of systems not run now from the existing <out>/peer.json",
    )
    args = parser.parse_args()

    if set(args.systems) & set(FLINK) and not FLINK_PYTHON.exists():
        parser.error(f"Flink runs in {FLINK_PYTHON.parent.parent}: make flink-venv creates it")
    work = args.work or Path(tempfile.mkdtemp(prefix="cutline-peer-bench-"))
    args.out.mkdir(parents=True, exist_ok=True)  # now, not after an hour of runs
    results = {"args": {k: str(v) for k, v in vars(args).items()}, "sizes": []}
    results["setup"] = (
        f"2 cores, local[2], parallelism 2, RocksDB everywhere; micro-batches of "
        f"{args.batch_records:,} records per partition ({args.python_batch_records:,} for the "
        f"Python API, which runs at most {args.python_minutes} min and no sustained phase); "
        f"runs of {args.minutes} min: the backlog (every key once, then {args.steady} x keys) "
        f"at full speed, then {args.rate:,} records/s; Cutline's GC every {args.gc_every_s:.0f} "
        f"s (grace {args.gc_grace_s:.0f} s) in the sustained phase. Spark variants: RocksDB "
        "state store with changelog checkpointing, Delta output via foreachBatch. Flink 2.3 "
        "SQL: mini-batch aggregation, RocksDB with bloom filters and "
        f"{args.flink_managed_mib} MiB of managed memory, incremental checkpoints every 3 s."
    )
    kept = {}
    if args.merge and (args.out / "peer.json").exists():
        kept = {e["size_mib"]: e for e in json.loads((args.out / "peer.json").read_text())["sizes"]}
        results["sizes"] = [kept[s] for s in sorted(kept)]  # replaced as sizes complete
    try:
        for size in args.sizes:
            keys = size * 2**20 // args.bytes_per_key
            base = work / f"input-{size}"
            started = time.monotonic()
            backlog, ts = build_input(base, keys, args.steady, seed=size, fmt=args.log_format)
            print(f"{size} MiB: {keys:,} keys, {backlog:,} records written in "
                  f"{time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
            entry = {"size_mib": size, "keys": keys, "backlog_records": backlog, "systems": {}}
            if size in kept:  # --merge: the systems not run now keep their figures
                entry["systems"] = {
                    k: v for k, v in kept[size]["systems"].items() if k not in args.systems
                }
            for system in args.systems:
                home = work / f"{system}-{size}"
                shutil.rmtree(home, ignore_errors=True)
                write = prepare_input(system, base, home)
                r = bench_system(system, home, write, keys, backlog, ts, args)
                r["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
                entry["systems"][system] = r
                print(system, json.dumps(r), flush=True)
                if args.work:  # kept: the driver's log, its lines timed from the process start
                    shutil.move(home / "driver.log", work / f"{system}-{size}-driver.log")
                shutil.rmtree(home, ignore_errors=True)
            state = entry["systems"].get("cutline", {}).get("state_bytes")
            entry["checkpoint_mib_cutline"] = round(state / 2**20) if state else None
            results["sizes"] = [e for e in results["sizes"] if e["size_mib"] != size] + [entry]
            results["sizes"].sort(key=lambda e: e["size_mib"])
            shutil.rmtree(base, ignore_errors=True)
            (args.out / "peer.json").write_text(json.dumps(results, indent=1) + "\n")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    write_report(results, args.out, SYSTEMS)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
