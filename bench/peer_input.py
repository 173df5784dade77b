"""The peer benchmark's input (bench/peer_bench.py): JSON events of the local log that every
system reads through ``cutline_log``, one topic of ``PARTITIONS`` partitions, each record a user,
an amount, a payload of ``PAYLOAD_BYTES`` and an event time that only grows."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutline.sources.log_format import append_records  # noqa: E402
from spark_jobs.sources.generate import PAYLOAD_BYTES, event_lines  # noqa: E402

TOPIC = "events"  # under <home>/log
PARTITIONS = 2
SCHEMA = "user string, amount double, payload string, ts long"  # the records' fields
CHUNK = 100_000  # records per append while writing the input


def write_events(log: Path, users: np.ndarray, rng: np.random.Generator, start_ts: int) -> int:
    """Append one record per element of ``users`` (split round-robin over the partitions);
    returns the next event time."""
    for lo in range(0, len(users), CHUNK * PARTITIONS):
        part = users[lo : lo + CHUNK * PARTITIONS]
        ts = start_ts + np.arange(len(part))
        cents = rng.integers(0, 10_000, len(part))
        payload = rng.bytes(PAYLOAD_BYTES // 2 * len(part)).hex().encode()
        lines = event_lines(part, cents, ts, payload)
        for p in range(PARTITIONS):
            append_records(log, TOPIC, p, lines[p::PARTITIONS])
        start_ts += len(part)
    return start_ts


def build_input(log: Path, keys: int, steady: float, seed: int) -> tuple[int, int]:
    """Every key once in random order, then ``steady`` x keys uniform records; returns the
    record count and the next event time."""
    rng = np.random.default_rng(seed)
    ts = write_events(log, rng.permutation(keys), rng, 1_767_225_600_000)
    extra = int(keys * steady)
    ts = write_events(log, rng.integers(0, keys, extra), rng, ts)
    return keys + extra, ts


class Appender(threading.Thread):
    """Appends uniformly random records at ``rate`` per second until stopped."""

    def __init__(self, log: Path, keys: int, rate: int, ts: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.log, self.keys, self.rate, self.ts = log, keys, rate, ts
        self.rng = np.random.default_rng(seed)
        self.stopped = threading.Event()
        self.appended = 0

    def append(self, n: int) -> None:
        self.ts = write_events(self.log, self.rng.integers(0, self.keys, n), self.rng, self.ts)
        self.appended += n

    def run(self) -> None:
        started = time.monotonic()
        while not self.stopped.is_set():
            due = int((time.monotonic() - started) * self.rate) - self.appended
            if due > 0:
                self.append(due)
            self.stopped.wait(0.5)
