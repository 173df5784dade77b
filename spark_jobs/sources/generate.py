"""Synthetic input for the example jobs: ``cutline generate``.

Deterministic from a seed: record ``i`` of partition ``p`` depends only on ``(seed, kind, p, i)``,
so two runs that generate the same counts write byte-identical logs. Records are generated and
serialised in vectorised chunks.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from cutline.sources.log_format import append_records, complete_size, partition_path
from state.errors import BadInputError

KINDS = ("clicks", "orders", "profiles", "events")
PAYLOAD_BYTES = 100  # of an "events" record
# what a record of each kind holds (JSON lines; ts: event time in epoch ms, 10 ms apart per
# partition with up to 2 s of disorder; users "user-<n>" of --users)
SCHEMAS = {
    "clicks": "user string, url string, ts long",
    "orders": "order_id string, user string, amount double, ts long",
    "profiles": "user string, country string, tier int, ts long",
    "events": f"user string, amount double, payload string ({PAYLOAD_BYTES} characters), ts long",
}
_CHUNK = 10_000
_EPOCH_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
_KIND_SEED = {"clicks": 1, "orders": 2, "profiles": 3, "events": 4}


def _records(kind: str, seed: int, partition: int, start: int, n: int, users: int) -> list[bytes]:
    """Records ``start .. start + n`` of one partition; chunk-aligned, so any split of a range
    into calls yields the same records."""
    out: list[bytes] = []
    for chunk in range(start // _CHUNK, (start + n - 1) // _CHUNK + 1 if n else 0):
        lines = _chunk(kind, seed, partition, chunk, users)
        lo = max(start, chunk * _CHUNK) - chunk * _CHUNK
        hi = min(start + n, (chunk + 1) * _CHUNK) - chunk * _CHUNK
        out.extend(lines[lo:hi])
    return out


def _chunk(kind: str, seed: int, partition: int, chunk: int, users: int) -> list[bytes]:
    """Records ``chunk * _CHUNK .. (chunk + 1) * _CHUNK`` of one partition as JSON lines."""
    start, n = chunk * _CHUNK, _CHUNK
    rng = np.random.default_rng([seed, _KIND_SEED[kind], partition, chunk])
    index = np.arange(start, start + n)
    user = rng.integers(0, users, n)
    # Event time advances 10 ms per record and partition, with up to 2 s of disorder.
    ts = _EPOCH_MS + index * 10 - rng.integers(0, 2_000, n)
    if kind == "clicks":
        page = rng.integers(0, 500, n)
        return [
            b'{"user":"user-%d","url":"/p/%d","ts":%d}' % (u, pg, t)
            for u, pg, t in zip(user.tolist(), page.tolist(), ts.tolist(), strict=True)
        ]
    if kind == "orders":
        cents = rng.integers(100, 50_000, n)
        return [
            b'{"order_id":"o-%d-%d","user":"user-%d","amount":%d.%02d,"ts":%d}'
            % (partition, i, u, c // 100, c % 100, t)
            for i, u, c, t in zip(
                index.tolist(), user.tolist(), cents.tolist(), ts.tolist(), strict=True
            )
        ]
    if kind == "events":
        cents = rng.integers(0, 10_000, n)
        return event_lines(user, cents, ts, rng.bytes(PAYLOAD_BYTES // 2 * n).hex().encode())
    countries = np.array([b"DE", b"FR", b"US", b"JP", b"BR"])
    country = countries[rng.integers(0, len(countries), n)]
    tier = rng.integers(0, 3, n)
    return [
        b'{"user":"user-%d","country":"%s","tier":%d,"ts":%d}' % (u, c, tr, t)
        for u, c, tr, t in zip(
            user.tolist(), country.tolist(), tier.tolist(), ts.tolist(), strict=True
        )
    ]


def event_lines(user: np.ndarray, cents: np.ndarray, ts: np.ndarray, payload: bytes) -> list[bytes]:
    """``events`` records as JSON lines: a user, an amount in cents, ``PAYLOAD_BYTES`` characters
    of ``payload`` per record, and an event time."""
    w = PAYLOAD_BYTES
    return [
        b'{"user":"user-%d","amount":%d.%02d,"payload":"%s","ts":%d}'
        % (u, c // 100, c % 100, payload[i * w : (i + 1) * w], t)
        for i, (u, c, t) in enumerate(zip(user.tolist(), cents.tolist(), ts.tolist(), strict=True))
    ]


def records_in(root: str | Path, topic: str, partition: int) -> int:
    """Complete records already in a partition (counted by newlines)."""
    path = partition_path(root, topic, partition)
    size = complete_size(path)
    if size == 0:
        return 0
    count = 0
    with open(path, "rb") as f:
        while size > 0:
            chunk = f.read(min(1 << 20, size))
            count += chunk.count(b"\n")
            size -= len(chunk)
    return count


def generate(
    root: str | Path,
    topic: str,
    kind: str,
    *,
    count: int,
    partitions: int = 2,
    seed: int = 42,
    users: int = 10_000,
    rate: float | None = None,
    total: bool = False,
) -> int:
    """Append ``count`` records per partition, or with ``total`` ``count`` in all spread evenly
    over the partitions (continuing where the log ends); ``rate`` limits records per second
    over all partitions. Returns the records written."""
    if kind not in KINDS:
        raise BadInputError(f"kind must be one of {KINDS}, got {kind!r}")
    if count < 0 or partitions < 1:
        raise BadInputError("count must be >= 0 and partitions >= 1")
    written = 0
    started = time.monotonic()
    done = {p: records_in(root, topic, p) for p in range(partitions)}
    share = {p: count // partitions + (p < count % partitions) for p in range(partitions)}
    target = {p: done[p] + (share[p] if total else count) for p in range(partitions)}
    while any(done[p] < target[p] for p in done):
        for p in range(partitions):
            n = min(_CHUNK, target[p] - done[p])
            if n <= 0:
                continue
            append_records(root, topic, p, _records(kind, seed, p, done[p], n, users))
            done[p] += n
            written += n
        if rate:
            ahead = written / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    return written
