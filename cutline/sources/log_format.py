"""The replayable local log's layout, and its JSON-lines format: how it is written, and how a
byte range of it is read.

A topic is a directory with one entry per partition, all of one format (:func:`topic_format`):
an append-only JSON-lines file ``partition-<p>.jsonl`` (this module), or a directory of Arrow
segments ``partition-<p>/`` (the columnar format, cutline/sources/log_segments.py). In a JSON-lines
file a position is a byte offset (the offset of the next record), so a source can be rewound to
any recorded position. Writers append whole lines with one write each; readers only consider data
up to the last newline.

A byte range is parsed by Arrow's JSON reader into a table, vectorised. Every record carries
``_partition`` and ``_next_offset`` (the position after it), from which the runtime takes the
position at each cut. A record that cannot be processed (not JSON, a value of the wrong type, a
null key) is not an error here: it is returned with null fields and the bad-record columns set
(:data:`BAD_COLUMNS`: the reason, the raw line, its offset), and the job's policy decides what
happens to it. Spark reads the log through the data source in cutline/sources/log.py.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from cutline.sources.base import (
    BAD_COLUMNS,
    NEXT_OFFSET_COLUMN,
    PARTITION_COLUMN,
)
from state.errors import BadInputError

_SCAN_CHUNK = 1 << 20
_RAW_LIMIT = 64 << 10  # characters of a bad record kept


class MalformedRecordError(BadInputError):
    """A record of the log could not be parsed; names the file and the byte range."""


def partition_path(root: str | Path, topic: str, partition: int) -> Path:
    return Path(root) / topic / f"partition-{int(partition)}.jsonl"


def topic_partitions(root: str | Path, topic: str) -> list[int]:
    """Partition numbers of a topic, from the files present, ascending."""
    return sorted(_entries(root, topic))


def topic_format(root: str | Path, topic: str) -> str:
    """``"jsonl"`` or ``"arrow"``: the format of a topic's partitions (``"jsonl"`` for a topic
    with none yet). A topic with partitions of both formats is a :class:`BadInputError`."""
    formats = set(_entries(root, topic).values())
    if len(formats) > 1:
        raise BadInputError(
            f"topic {topic!r} under {root} mixes JSON-lines files and Arrow segment directories"
        )
    return formats.pop() if formats else "jsonl"


def _entries(root: str | Path, topic: str) -> dict[int, str]:
    """Partition number -> format, from the entries of the topic's directory."""
    directory = Path(root) / topic
    if not directory.is_dir():
        return {}
    out: dict[int, str] = {}
    for entry in directory.iterdir():
        number, dot, suffix = entry.name.removeprefix("partition-").partition(".")
        if not entry.name.startswith("partition-") or not number.isdigit():
            continue
        if (dot, suffix) == (".", "jsonl"):
            fmt = "jsonl"
        elif not dot and entry.is_dir():
            fmt = "arrow"
        else:
            continue
        if out.setdefault(int(number), fmt) != fmt:
            raise BadInputError(f"partition {number} of {directory} is in two formats")
    return out


def complete_size(path: Path) -> int:
    """Bytes of ``path`` up to and including its last newline (a torn last line is ignored)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb") as f:
        pos = size
        while pos > 0:
            step = min(_SCAN_CHUNK, pos)
            f.seek(pos - step)
            chunk = f.read(step)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                return pos - step + idx + 1
            pos -= step
    return 0


def offset_after_records(path: Path, start: int, max_records: int | None, limit: int) -> int:
    """The offset after at most ``max_records`` whole lines from ``start`` (not past ``limit``)."""
    if max_records is None or start >= limit:
        return max(start, limit)
    pos, remaining = start, max_records
    with open(path, "rb") as f:
        f.seek(start)
        while pos < limit and remaining > 0:
            chunk = f.read(min(_SCAN_CHUNK, limit - pos))
            newlines = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10)
            if len(newlines) >= remaining:
                return pos + int(newlines[remaining - 1]) + 1
            remaining -= len(newlines)
            pos += len(chunk)
    return min(pos, limit)


def append_records(root: str | Path, topic: str, partition: int, lines: Sequence[bytes]) -> int:
    """Append JSON lines to one partition with one write; returns the new end offset."""
    path = partition_path(root, topic, partition)
    if path.with_suffix("").is_dir():
        raise BadInputError(f"{path.with_suffix('')} exists: this topic is in the Arrow format")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines)
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def read_range(
    path: Path,
    partition: int,
    start: int,
    end: int,
    schema: pa.Schema,
    key: str | tuple[str, ...] = (),
) -> pa.Table:
    """The records in bytes ``[start, end)`` of ``path``, parsed with Arrow's JSON reader, with
    their positions and the bad-record columns (set on records that are not JSON objects, have a
    value of the wrong type, or a null ``key``)."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    return parse_lines(data, start, partition, schema, key, str(path))


def parse_lines(
    data: bytes,
    start: int,
    partition: int,
    schema: pa.Schema,
    key: str | tuple[str, ...] = (),
    where: str = "",
) -> pa.Table:
    """JSON lines ``data``, which start at byte ``start`` of partition ``partition`` (named
    ``where`` in errors), as :func:`read_range` returns them."""
    end = start + len(data)
    newlines = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    ends = start + newlines.astype(np.int64) + 1
    lines = data.split(b"\n")[: len(newlines)]
    try:
        table = _parse(data, schema)
        good = np.ones(len(newlines), bool)
        reasons: list[str | None] = [None] * len(newlines)
        if table.num_rows != len(newlines):
            raise _LineByLine
    except (pa.ArrowInvalid, pa.ArrowTypeError, _LineByLine):
        reasons = [_problem(line, schema) for line in lines]
        good = np.array([r is None for r in reasons], bool)
        kept = b"".join(line + b"\n" for line, ok in zip(lines, good, strict=True) if ok)
        try:
            table = _parse(kept, schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise MalformedRecordError(
                f"malformed record in {where} between byte offsets {start} and {end}: {e}"
            ) from e
    null_key, why = null_keys(table, key)
    if null_key.any():
        parsed = np.flatnonzero(good)[null_key]  # the lines of the records with a null key
        for i, reason in zip(parsed, why[null_key], strict=True):
            reasons[i] = reason
        good[parsed] = False
        table = table.filter(pa.array(~null_key))
    out = with_positions(table, partition, ends[good])
    if good.all():
        return out
    bad = np.flatnonzero(~good)
    starts = np.concatenate([[start], ends[:-1]])[bad]
    raw = [lines[i][:_RAW_LIMIT].decode("utf-8", "replace") for i in bad]
    rejects = with_positions(schema.empty_table().slice(0, 0), partition, ends[bad], len(bad))
    return pa.concat_tables([out, as_bad(rejects, [reasons[i] for i in bad], raw, starts)])


def null_keys(table: pa.Table, key: str | tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Which records have a null in a column of ``key`` (a null in any makes a record bad), and
    for each the reason naming its first such column (None for the others)."""
    null_key = np.zeros(table.num_rows, bool)
    reasons = np.full(table.num_rows, None, object)
    for column in (key,) if isinstance(key, str) else key:
        nulls = np.asarray(table.column(column).is_null())
        reasons[nulls & ~null_key] = f"null key {column!r}"
        null_key |= nulls
    return null_key, reasons


def as_bad(rejects: pa.Table, reasons, raw, offsets) -> pa.Table:
    """``rejects`` (with :func:`with_positions`' columns) with their bad-record columns set:
    why each is bad, its raw form, and where it starts in its partition."""
    for column, values in zip(BAD_COLUMNS, (reasons, raw, offsets), strict=True):
        rejects = rejects.set_column(
            rejects.schema.get_field_index(column.name), column, pa.array(values, column.type)
        )
    return rejects


class _LineByLine(Exception):
    """The fast path cannot tell which lines are bad: check them one by one."""


def _parse(data: bytes, schema: pa.Schema) -> pa.Table:
    import pyarrow.json as pajson

    return pajson.read_json(
        io.BytesIO(data),
        read_options=pajson.ReadOptions(block_size=max(len(data), 1 << 16)),
        parse_options=pajson.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore"
        ),
    )


def with_positions(
    table: pa.Table, partition: int, ends: np.ndarray, n: int | None = None
) -> pa.Table:
    """``table`` (or ``n`` all-null rows of its schema) with the position columns (``ends``: the
    position after each record) and null bad-record columns."""
    if n is not None:
        table = pa.Table.from_arrays(
            [pa.nulls(n, f.type) for f in table.schema], schema=table.schema
        )
    rows = table.num_rows
    table = table.append_column(
        PARTITION_COLUMN, pa.array(np.full(rows, partition, np.int32))
    ).append_column(NEXT_OFFSET_COLUMN, pa.array(ends.astype(np.int64)))
    for column in BAD_COLUMNS:
        table = table.append_column(column, pa.nulls(rows, column.type))
    return table


def _problem(line: bytes, schema: pa.Schema) -> str | None:
    """Why ``line`` is not a record of ``schema``, or None."""
    if not line.strip():
        return "empty line"
    try:
        doc = json.loads(line)
    except ValueError as e:
        return f"not valid JSON ({e})"
    if not isinstance(doc, dict):
        return f"not a JSON object but {type(doc).__name__}"
    for field in schema:
        value = doc.get(field.name)
        if value is None:
            continue
        t = field.type
        if pa.types.is_string(t):
            ok = isinstance(value, str)
        elif pa.types.is_boolean(t):
            ok = isinstance(value, bool)
        elif pa.types.is_integer(t):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif pa.types.is_floating(t):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        else:
            ok = True  # left to Arrow's reader
        if not ok:
            return f"field {field.name!r} must be {t}, got {json.dumps(value)[:40]}"
    return None
