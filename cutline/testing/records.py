"""What the harness feeds its stages: records in the forms a test writes them (Arrow tables,
pandas frames, lists of dicts) tagged with the routing columns the operator reads, and the
smallest job around a chain of stages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa

from cutline.job import JobDefinition, KeyedProcess
from cutline.keyed_process import SOURCE_COLUMN
from cutline.sources.base import NEXT_OFFSET_COLUMN, PARTITION_COLUMN

Rows = pa.Table | pd.DataFrame | Sequence[Mapping[str, Any]]
HARNESS_JOB = "harness"


def as_table(rows: Rows) -> pa.Table:
    """``rows`` as an Arrow table (a list of dicts infers the types: ints become int64)."""
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pd.DataFrame):
        return pa.Table.from_pandas(rows, preserve_index=False)
    return pa.Table.from_pylist(list(rows))


def tagged(table: pa.Table, source: str) -> pa.Table:
    """Records of input ``source`` with the routing columns the operator reads them by."""
    n = table.num_rows
    return (
        table.append_column(SOURCE_COLUMN, pa.array([source] * n, pa.string()))
        .append_column(PARTITION_COLUMN, pa.array([0] * n, pa.int32()))
        .append_column(NEXT_OFFSET_COLUMN, pa.array(range(1, n + 1), pa.int64()))
    )


def chain_job(stages: tuple[KeyedProcess, ...]) -> JobDefinition:
    """The smallest job around a chain of stages: what the runtime's routing reads."""
    from cutline import DeltaSink, LogSource
    from state.config import CheckpointConfig

    stage_names = {s.name for s in stages}
    names = dict.fromkeys(n for s in stages for n in s.inputs if n not in stage_names)
    sources = tuple(LogSource(name, name, "x string") for name in names)
    return JobDefinition(
        name=HARNESS_JOB,
        sources=sources,
        operator=stages,
        sink=DeltaSink("out", "out"),
        checkpoint=CheckpointConfig(interval_ms=1_000),
        parallelism=1,
    )
