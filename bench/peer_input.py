"""The peer benchmark's input (bench/peer_bench.py): events of the local log that Cutline and
Spark read through ``cutline_log``, one topic of ``PARTITIONS`` partitions, each record a user, an
amount, a payload of ``PAYLOAD_BYTES`` and an event time that only grows. The log is in Arrow
segments (``--log-format arrow``, the default) or JSON lines. Flink reads the same records as
immutable JSON files (:class:`FileDrop`): its filesystem source discovers new files but does not
follow a growing one."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutline.sources.log_format import (  # noqa: E402
    append_records,
    partition_path,
    topic_format,
    topic_partitions,
)
from cutline.sources.log_segments import (  # noqa: E402
    append_table,
    read_segment,
    segment_dir,
    segments,
)
from spark_jobs.sources.generate import PAYLOAD_BYTES, record_lines, record_table  # noqa: E402

TOPIC = "events"  # under <home>/log
PARTITIONS = 2
SCHEMA = "user string, amount double, payload string, ts long"  # the records' fields
CHUNK = 100_000  # records per append while writing the input
FORMATS = ("arrow", "jsonl")

Values = dict[str, np.ndarray]  # a partition's records: user, cents, payload, ts
Write = Callable[[int, Values], None]  # appends a partition's records


def log_writer(log: Path, fmt: str | None = None) -> Write:
    """Appends to the local log under ``log``, in ``fmt`` (default: the topic's format, Arrow for
    a new one)."""
    if fmt is None:
        fmt = topic_format(log, TOPIC) if topic_partitions(log, TOPIC) else "arrow"
    if fmt == "arrow":
        return lambda p, values: append_table(log, TOPIC, p, record_table(TOPIC, p, values))
    return lambda p, values: append_records(log, TOPIC, p, record_lines(TOPIC, p, values))


class FileDrop:
    """Writes each append as a new file ``events-<partition>-<n>.json`` under ``directory``,
    whole or not at all (a hidden name renamed into place: Flink skips hidden files)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.files = 0

    def __call__(self, partition: int, values: Values) -> None:
        self.put(partition, record_lines(TOPIC, partition, values))

    def put(self, partition: int, lines: list[bytes]) -> None:
        name = f"events-{partition}-{self.files:08d}.json"
        tmp = self.directory / ("." + name)
        tmp.write_bytes(b"\n".join(lines) + b"\n")
        os.rename(tmp, self.directory / name)
        self.files += 1

    def copy_log(self, log: Path) -> None:
        """Every record of the log under ``log`` (either format), in files of at most ``CHUNK``
        records."""
        for partition in range(PARTITIONS):
            for _, path in segments(segment_dir(log, TOPIC, partition)):
                table = read_segment(path)
                for lo in range(0, table.num_rows, CHUNK):
                    self.put(partition, json_lines(table.slice(lo, CHUNK)))
            if partition_path(log, TOPIC, partition).exists():
                with open(partition_path(log, TOPIC, partition), "rb") as f:
                    while lines := f.readlines(CHUNK * 160):
                        self.put(partition, [line.rstrip(b"\n") for line in lines])


def json_lines(table: pa.Table) -> list[bytes]:
    """An events table's records as JSON lines."""
    text = table.to_pandas().to_json(orient="records", lines=True, double_precision=15)
    return [line.encode() for line in text.splitlines()]


def write_events(write: Write, users: np.ndarray, rng: np.random.Generator, start_ts: int) -> int:
    """Writes one record per element of ``users`` (split round-robin over the partitions);
    returns the next event time."""
    for lo in range(0, len(users), CHUNK * PARTITIONS):
        part = users[lo : lo + CHUNK * PARTITIONS]
        ts = start_ts + np.arange(len(part))
        cents = rng.integers(0, 10_000, len(part))
        payload = rng.bytes(PAYLOAD_BYTES // 2 * len(part)).hex().encode()
        values = {
            "user": part,
            "cents": cents,
            "payload": np.frombuffer(payload, f"S{PAYLOAD_BYTES}"),
            "ts": ts,
        }
        for p in range(PARTITIONS):
            write(p, {k: v[p::PARTITIONS] for k, v in values.items()})
        start_ts += len(part)
    return start_ts


def build_input(
    log: Path, keys: int, steady: float, seed: int, fmt: str = "arrow"
) -> tuple[int, int]:
    """Every key once in random order, then ``steady`` x keys uniform records, in ``fmt``;
    returns the record count and the next event time."""
    rng, write = np.random.default_rng(seed), log_writer(log, fmt)
    ts = write_events(write, rng.permutation(keys), rng, 1_767_225_600_000)
    extra = int(keys * steady)
    ts = write_events(write, rng.integers(0, keys, extra), rng, ts)
    return keys + extra, ts


class Appender(threading.Thread):
    """Appends uniformly random records at ``rate`` per second until stopped."""

    def __init__(self, write: Write, keys: int, rate: int, ts: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.write, self.keys, self.rate, self.ts = write, keys, rate, ts
        self.rng = np.random.default_rng(seed)
        self.stopped = threading.Event()
        self.appended = 0

    def append(self, n: int) -> None:
        self.ts = write_events(self.write, self.rng.integers(0, self.keys, n), self.rng, self.ts)
        self.appended += n

    def run(self) -> None:
        started = time.monotonic()
        while not self.stopped.is_set():
            due = int((time.monotonic() - started) * self.rate) - self.appended
            if due > 0:
                self.append(due)
            self.stopped.wait(0.5)
