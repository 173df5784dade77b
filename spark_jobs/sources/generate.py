"""Synthetic input for the example jobs: ``cutline generate``.

Deterministic from a seed: record ``i`` of partition ``p`` depends only on ``(seed, kind, p, i)``,
so two runs that generate the same counts write byte-identical logs, and the two formats of the
log (JSON lines, Arrow segments) the same records. Records are generated and serialised in
vectorised chunks.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from cutline.sources.log_format import (
    append_records,
    complete_size,
    partition_path,
    topic_format,
)
from cutline.sources.log_segments import append_table, end_offset, segment_dir
from state.errors import BadInputError

KINDS = ("clicks", "orders", "profiles", "events")
FORMATS = ("jsonl", "arrow")  # the local log's (cutline/sources/log_format.py)
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
_COUNTRIES = np.array([b"DE", b"FR", b"US", b"JP", b"BR"])
_KIND_SEED = {"clicks": 1, "orders": 2, "profiles": 3, "events": 4}


def _records(
    kind: str, seed: int, partition: int, start: int, n: int, users: int, fmt: str = "jsonl"
) -> list[bytes] | pa.Table:
    """Records ``start .. start + n`` of one partition, as JSON lines or (``fmt="arrow"``) one
    Arrow table; chunk-aligned, so any split of a range into calls yields the same records."""
    out: list = []
    for chunk in range(start // _CHUNK, (start + n - 1) // _CHUNK + 1 if n else 0):
        lo = max(start, chunk * _CHUNK) - chunk * _CHUNK
        hi = min(start + n, (chunk + 1) * _CHUNK) - chunk * _CHUNK
        columns = {k: v[lo:hi] for k, v in _chunk(kind, seed, partition, chunk, users).items()}
        if fmt == "arrow":
            out.append(record_table(kind, partition, columns))
        else:
            out.extend(record_lines(kind, partition, columns))
    if fmt != "arrow":
        return out
    return pa.concat_tables(out) if out else record_table(kind, partition, _empty(kind))


def _chunk(kind: str, seed: int, partition: int, chunk: int, users: int) -> dict[str, np.ndarray]:
    """The values of records ``chunk * _CHUNK .. (chunk + 1) * _CHUNK`` of one partition."""
    start, n = chunk * _CHUNK, _CHUNK
    rng = np.random.default_rng([seed, _KIND_SEED[kind], partition, chunk])
    index = np.arange(start, start + n)
    user = rng.integers(0, users, n)
    # Event time advances 10 ms per record and partition, with up to 2 s of disorder.
    ts = _EPOCH_MS + index * 10 - rng.integers(0, 2_000, n)
    if kind == "clicks":
        return {"index": index, "user": user, "page": rng.integers(0, 500, n), "ts": ts}
    if kind == "orders":
        return {"index": index, "user": user, "cents": rng.integers(100, 50_000, n), "ts": ts}
    if kind == "events":
        cents = rng.integers(0, 10_000, n)
        payload = np.frombuffer(
            rng.bytes(PAYLOAD_BYTES // 2 * n).hex().encode(), f"S{PAYLOAD_BYTES}"
        )
        return {"index": index, "user": user, "cents": cents, "payload": payload, "ts": ts}
    country = _COUNTRIES[rng.integers(0, len(_COUNTRIES), n)]
    return {
        "index": index,
        "user": user,
        "country": country,
        "tier": rng.integers(0, 3, n),
        "ts": ts,
    }


def _empty(kind: str) -> dict[str, np.ndarray]:
    return {k: v[:0] for k, v in _chunk(kind, 0, 0, 0, 1).items()}


def record_lines(kind: str, partition: int, c: dict[str, np.ndarray]) -> list[bytes]:
    """Records of ``kind`` in ``partition`` as JSON lines, from their values (``c``: as
    :func:`_chunk` gives them; ``events`` needs only user, cents, payload and ts)."""
    user, ts = c["user"].tolist(), c["ts"].tolist()
    if kind == "clicks":
        return [
            b'{"user":"user-%d","url":"/p/%d","ts":%d}' % row
            for row in zip(user, c["page"].tolist(), ts, strict=True)
        ]
    if kind == "orders":
        return [
            b'{"order_id":"o-%d-%d","user":"user-%d","amount":%d.%02d,"ts":%d}'
            % (partition, i, u, cents // 100, cents % 100, t)
            for i, u, cents, t in zip(
                c["index"].tolist(), user, c["cents"].tolist(), ts, strict=True
            )
        ]
    if kind == "events":
        return [
            b'{"user":"user-%d","amount":%d.%02d,"payload":"%s","ts":%d}'
            % (u, cents // 100, cents % 100, payload, t)
            for u, cents, payload, t in zip(
                user, c["cents"].tolist(), c["payload"].tolist(), ts, strict=True
            )
        ]
    return [
        b'{"user":"user-%d","country":"%s","tier":%d,"ts":%d}' % row
        for row in zip(user, c["country"].tolist(), c["tier"].tolist(), ts, strict=True)
    ]


def record_table(kind: str, partition: int, c: dict[str, np.ndarray]) -> pa.Table:
    """The same records as an Arrow table of the kind's schema, the values
    :func:`record_lines` writes."""
    user = pa.array(np.char.add(b"user-", c["user"].astype("S20")).astype(str))
    ts = pa.array(c["ts"], pa.int64())
    if kind == "clicks":
        url = np.char.add(b"/p/", c["page"].astype("S20")).astype(str)
        return pa.table({"user": user, "url": url, "ts": ts})
    if kind in ("orders", "events"):
        amount = pa.array(c["cents"] / 100, pa.float64())
        if kind == "events":
            payload = pa.array(c["payload"].astype(str))
            return pa.table({"user": user, "amount": amount, "payload": payload, "ts": ts})
        order = np.char.add(f"o-{partition}-".encode(), c["index"].astype("S20")).astype(str)
        return pa.table({"order_id": order, "user": user, "amount": amount, "ts": ts})
    tier = pa.array(c["tier"], pa.int32())
    return pa.table({"user": user, "country": c["country"].astype(str), "tier": tier, "ts": ts})


def records_in(root: str | Path, topic: str, partition: int) -> int:
    """Complete records already in a partition (JSON lines: counted by newlines)."""
    if topic_format(root, topic) == "arrow":
        return end_offset(segment_dir(root, topic, partition))
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
    fmt: str | None = None,
) -> int:
    """Append ``count`` records per partition, or with ``total`` ``count`` in all spread evenly
    over the partitions (continuing where the log ends); ``rate`` limits records per second
    over all partitions. ``fmt``: ``"jsonl"`` or ``"arrow"`` (default: the topic's, JSON lines
    for a new one). Returns the records written."""
    if kind not in KINDS:
        raise BadInputError(f"kind must be one of {KINDS}, got {kind!r}")
    fmt = fmt or topic_format(root, topic)
    if fmt not in FORMATS:
        raise BadInputError(f"format must be one of {FORMATS}, got {fmt!r}")
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
            records = _records(kind, seed, p, done[p], n, users, fmt)
            if fmt == "arrow":
                append_table(root, topic, p, records)
            else:
                append_records(root, topic, p, records)
            done[p] += n
            written += n
        if rate:
            ahead = written / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    return written
