"""What happens to a record that cannot be processed (the job's ``bad_records`` policy).

Sources never fail on a bad record: they return it with null fields and the reason, the raw
record and its offset (spark_jobs/sources/frames.py). In the subtask that receives it:

- ``fail`` (the default): the record is left out and reported; the driver then fails the attempt
  with one line that names the source, partition, offset and reason, as a non-retryable error
  (exit 2: a restore would meet the same record);
- ``dead_letter``: the record is staged to the dead-letter sink with the epoch's output and
  committed with it (exactly once, like the output), and counted in the checkpoint's manifest
  (``counters.bad_records``).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cutline.keyed_process import SOURCE_COLUMN
from cutline.sources.base import BAD_OFFSET, BAD_RAW, BAD_REASON, PARTITION_COLUMN
from spark_jobs.errors import BadRecordError

DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("reason", pa.string()),
        ("raw", pa.string()),
    ]
)


def split_bad(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``(good, bad)`` records of a subtask's micro-batch."""
    if BAD_REASON not in table.column_names or table.column(BAD_REASON).null_count == len(table):
        return table, table.slice(0, 0)
    bad = pc.is_valid(table.column(BAD_REASON))
    return table.filter(pc.invert(bad)), table.filter(bad)


def dead_letters(bad: pa.Table) -> pa.Table:
    """Bad records as rows of the dead-letter table."""
    return pa.Table.from_arrays(
        [
            bad.column(SOURCE_COLUMN).cast(pa.string()),
            bad.column(PARTITION_COLUMN).cast(pa.int32()),
            bad.column(BAD_OFFSET).cast(pa.int64()),
            bad.column(BAD_REASON),
            bad.column(BAD_RAW),
        ],
        schema=DEAD_LETTER_SCHEMA,
    )


def first_bad(bad: pa.Table) -> dict[str, Any] | None:
    """The bad record with the lowest (source, partition, offset), for the error line."""
    if bad.num_rows == 0:
        return None
    rows = dead_letters(bad).sort_by([("source", "ascending"), ("partition", "ascending"),
                                      ("offset", "ascending")]).slice(0, 1)  # fmt: skip
    return rows.to_pylist()[0]


def bad_record_error(found: list[dict[str, Any]], total: int) -> BadRecordError:
    """The one-line error for the bad records a micro-batch met (``found``: one per subtask)."""
    r = min(found, key=lambda b: (b["source"], b["partition"], b["offset"]))
    more = f" ({total - 1} more in this micro-batch)" if total > 1 else ""
    return BadRecordError(
        f"bad record in source {r['source']!r} partition {r['partition']} at offset "
        f"{r['offset']}: {r['reason']}{more}; fix the input, or set the job's "
        "bad_records='dead_letter' (cutline run --bad-records dead_letter) to skip such records"
    )
