"""The file source's input in the tests: clicks as JSON-lines files, put into a directory or an
S3 prefix and read back from it, without Cutline's code (boto3 for S3, with the endpoint from
the environment as a deployment sets it)."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import pandas as pd


def clicks(n: int, seed: int) -> list[dict]:
    """``n`` valid clicks: users of 300, pages of 50, event times a second apart."""
    rng = random.Random(seed)
    return [
        {"user": f"u{rng.randrange(300)}", "url": f"/p/{rng.randrange(50)}", "ts": 1_000 * i}
        for i in range(n)
    ]


def json_lines(records: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def _bucket_and_prefix(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def _s3():
    import boto3

    return boto3.client("s3")


def put_file(where: str | Path, name: str, records: list[dict]) -> None:
    """The file ``name`` (relative, may hold ``/``) with ``records``, appearing whole: written
    aside and renamed in on local disk, one PUT on S3."""
    data = json_lines(records)
    if str(where).startswith("s3://"):
        bucket, prefix = _bucket_and_prefix(str(where))
        _s3().put_object(Bucket=bucket, Key=f"{prefix}/{name}".lstrip("/"), Body=data)
        return
    target = Path(where) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_bytes(data)
    tmp.rename(target)


def _stored(where: str | Path) -> list[tuple[str, bytes]]:
    """``(name relative to where, bytes)`` of every ``.json`` file, sorted by name."""
    if not str(where).startswith("s3://"):
        root = Path(where)
        return [
            (p.relative_to(root).as_posix(), p.read_bytes()) for p in sorted(root.rglob("*.json"))
        ]
    bucket, prefix = _bucket_and_prefix(str(where))
    s3, found = _s3(), []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for item in page.get("Contents", []):
            name = item["Key"][len(prefix) + 1 :]
            if name.endswith(".json"):
                found.append((name, s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()))
    return sorted(found)


def read_files(where: str | Path) -> pd.DataFrame:
    """Every record of the JSON files under ``where`` (a directory or ``s3://bucket/prefix``)
    with its partition (the CRC-32 of the file's relative name, 31 bits) and byte offset."""
    rows = []
    for name, data in _stored(where):
        partition, offset = zlib.crc32(name.encode()) & 0x7FFFFFFF, 0
        for line in data.splitlines(keepends=True):
            rows.append({**json.loads(line), "partition": partition, "offset": offset})
            offset += len(line)
    return pd.DataFrame(rows)
