"""The local log's columnar format: a partition is a directory of Arrow IPC segments.

``<root>/<topic>/partition-<p>/<first record offset, 20 digits>.arrow``: each append is one
segment, written whole under a hidden temporary name, flushed to disk and then linked into place
under its first record's offset, which only one writer can take. A reader never sees a part of
an append: a writer killed mid-append leaves its hidden file (removed by the next writer) and no
segment. A position is a record offset (the offset of the next record), so a micro-batch may end
inside a segment. Segments follow each other without gap or overlap; a range that crosses a gap,
a file that is not an Arrow file, or a field that cannot be cast to the job's schema is a
:class:`~cutline.sources.log_format.MalformedRecordError` naming the file, never a silent skip.

Reading maps the segments into memory and slices them: no parse. A record whose key is null is
returned as a bad record (its raw form is the record as JSON), as in the JSON-lines format.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline.sources.log_format import MalformedRecordError, as_bad, null_keys, with_positions
from state.errors import BadInputError
from state.processes import alive

SUFFIX = ".arrow"
_NAME = re.compile(r"^(\d{20})\.arrow$")
_TMP = re.compile(r"^\.(\d{20})\.(\d+)\.[0-9a-f]+\.tmp$")  # .<offset>.<pid>.<nonce>.tmp
_APPEND_TRIES = 8


def segment_dir(root: str | Path, topic: str, partition: int) -> Path:
    return Path(root) / topic / f"partition-{int(partition)}"


def segments(directory: Path) -> list[tuple[int, Path]]:
    """The segments of a partition: (first record offset, path), ascending."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), directory / n) for n in names if (m := _NAME.match(n))]
    return sorted(found)


def end_offset(directory: Path) -> int:
    """The offset after the partition's last record (0 when it has none)."""
    found = segments(directory)
    if not found:
        return 0
    start, path = found[-1]
    return start + read_segment(path).num_rows


def append_table(root: str | Path, topic: str, partition: int, table: pa.Table) -> int:
    """Appends ``table``'s rows to one partition as one segment, all or nothing; returns the new
    end offset. Another writer appending at the same moment makes this one retry after it."""
    directory = segment_dir(root, topic, partition)
    if directory.with_suffix(".jsonl").exists():
        raise BadInputError(f"{directory}.jsonl exists: this topic is in the JSON-lines format")
    directory.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(directory)
    for _ in range(_APPEND_TRIES):
        start = end_offset(directory)
        if table.num_rows == 0:
            return start
        tmp = directory / f".{start:020d}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
                w.write_table(table)
            _fsync(tmp)
            os.link(tmp, directory / f"{start:020d}{SUFFIX}")
        except FileExistsError:
            continue  # another writer took this offset: append after its segment
        finally:
            tmp.unlink(missing_ok=True)
        _fsync(directory)
        return start + table.num_rows
    raise BadInputError(f"{directory}: could not append after {_APPEND_TRIES} concurrent appends")


def read_segments(
    directory: Path,
    partition: int,
    start: int,
    end: int,
    schema: pa.Schema,
    key: str | tuple[str, ...] = (),
) -> pa.Table:
    """The records at offsets ``[start, end)`` with their positions and the bad-record columns
    (set on records whose ``key`` has a null), the fields of ``schema`` cast to its types."""
    found = segments(directory)
    # the segment holding ``start``, then those after it, each starting where the last ended
    i = max(0, bisect.bisect_right([first for first, _ in found], start) - 1)
    pieces, at = [], start
    for first, path in found[i:]:
        if at >= end:
            break
        if first > at or (pieces and first != at):
            raise MalformedRecordError(
                f"{path}: starts at record {first}, where record {at} was expected"
            )
        table = read_segment(path)
        last = first + table.num_rows
        if last <= at:
            continue  # ``start`` lies past this segment: the next one must hold it
        pieces.append(_conform(table.slice(at - first, min(end, last) - at), schema, path))
        at = min(end, last)
    if at < end:
        raise MalformedRecordError(
            f"{directory}: records {start} to {end} asked, the log ends at record {at}"
        )
    table = pa.concat_tables(pieces) if pieces else schema.empty_table()
    return _with_bad_keys(table, partition, start, key)


def _with_bad_keys(table: pa.Table, partition: int, start: int, key) -> pa.Table:
    offsets = start + np.arange(table.num_rows, dtype=np.int64)
    null_key, reasons = null_keys(table, key)
    if not null_key.any():
        return with_positions(table, partition, offsets + 1)
    good = with_positions(table.filter(pa.array(~null_key)), partition, offsets[~null_key] + 1)
    bad_rows = table.filter(pa.array(null_key))
    raw = [json.dumps(row, default=str) for row in bad_rows.to_pylist()]
    rejects = with_positions(bad_rows, partition, offsets[null_key] + 1)
    bad = as_bad(rejects, list(reasons[null_key]), raw, offsets[null_key])
    return pa.concat_tables([good, bad])


def _conform(table: pa.Table, schema: pa.Schema, path: Path) -> pa.Table:
    """``table`` with exactly ``schema``'s fields: a missing one null, another type cast."""
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = pc.cast(column, field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise MalformedRecordError(
                    f"{path}: field {field.name!r} is {column.type}, not castable to "
                    f"{field.type}: {e}"
                ) from e
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def read_segment(path: Path) -> pa.Table:
    """A segment's records, mapped into memory (not copied)."""
    try:
        return pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise MalformedRecordError(f"{path} is not a readable Arrow segment: {e}") from e


def _remove_abandoned(directory: Path) -> None:
    """Removes the temporary files of writers on this host that are gone."""
    for name in os.listdir(directory):
        m = _TMP.match(name)
        if m and not alive(int(m.group(2))):
            (directory / name).unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
