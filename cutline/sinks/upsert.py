"""The Delta upsert sink: a Delta table holding the latest row per key of a stage's output,
exactly once.

It commits as the append sink does (cutline/sinks/delta.py: staged per attempt, one conditional
commit per checkpoint recording the epochs it covers, fenced per attempt), but lands the rows as
a MERGE: of the rows the commit covers, the latest per key (by ``order_by`` when given, then by
epoch, then in the order the stage emitted them) updates the key's row or inserts it. A commit
redone after a crash covers only epochs above the table's committed one, and a MERGE of a key's
latest row is the same however often it runs, so a replay changes nothing. The row's ``_epoch``
says which epoch last wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from cutline.keyed_process import Key, key_columns
from cutline.sinks.base import Sink, SinkWriter
from cutline.sinks.delta import DeltaSinkWriter
from cutline.sinks.staging import EPOCH_COLUMN
from cutline.validation import JobDefinitionError, check_name
from state.errors import BadInputError

_ROW = "__row"  # the rows' order as staged, while picking each key's latest


@dataclass(frozen=True)
class DeltaUpsertSink(Sink):
    """A Delta table under the output root, ``<output>/<table>``, holding per ``key``
    (a column of the stage's output, or a tuple of them) the latest row of stage ``stage``
    (default: the job's last stage). Key the sink as the stage is keyed (or by more columns):
    then a key's rows come from one subtask, in the order the stage emitted them. ``order_by``:
    a column deciding which of a key's rows is the latest (the largest wins; ties go to the
    later epoch, then the later row)."""

    name: str
    table: str
    key: Key
    stage: str | None = None
    order_by: str | None = None

    def __post_init__(self) -> None:
        check_name("sink.name", self.name)
        check_name("sink.table", self.table)
        columns = key_columns(self.key)
        if not columns or not all(isinstance(c, str) and c for c in columns):
            raise JobDefinitionError(
                f"sink {self.name!r}: key must be a column or a tuple of columns, got {self.key!r}"
            )
        if EPOCH_COLUMN in columns or self.order_by == EPOCH_COLUMN:
            raise JobDefinitionError(f"sink {self.name!r}: {EPOCH_COLUMN!r} is the runtime's")
        if not isinstance(self.key, str):
            object.__setattr__(self, "key", columns)

    @property
    def target(self) -> str:
        return f"Delta table {self.table!r}"

    def writer(self, job_id: str, attempt: int, *, output: str, staging: str) -> SinkWriter:
        return DeltaUpsertWriter(self, job_id, output, staging, attempt)


class DeltaUpsertWriter(DeltaSinkWriter):
    """One attempt's writer of a :class:`DeltaUpsertSink`: commits as the append writer does,
    landing rows by MERGE."""

    def __init__(
        self, sink: DeltaUpsertSink, job_id: str, output: str, staging: str, attempt: int
    ) -> None:
        super().__init__(job_id, sink.name, sink.table, output, staging, attempt)
        self.key, self.order_by = key_columns(sink.key), sink.order_by

    def _write(self, dt, data: pa.Table, first: bool, properties) -> None:
        if data.num_rows == 0:  # only the fence and the epochs
            super()._write(dt, data, first, properties)
            return
        latest = self.latest_per_key(data)
        if first:
            super()._write(dt, latest, first, properties)
            return
        on = " AND ".join(f"t.`{c}` = s.`{c}`" for c in self.key)
        merge = dt.merge(
            latest,
            on,
            source_alias="s",
            target_alias="t",
            merge_schema=True,
            commit_properties=properties,
        )
        merge.when_matched_update_all().when_not_matched_insert_all().execute()

    def latest_per_key(self, data: pa.Table) -> pa.Table:
        """Each key's latest row of ``data`` (staged in epoch, then emission order). A row
        without a full key cannot be upserted: a ``BadInputError`` names the sink and column."""
        missing = [c for c in [*self.key, self.order_by] if c and c not in data.column_names]
        if missing:
            raise BadInputError(
                f"sink {self.sink!r}: the stage's output has no column {missing[0]!r} (its "
                f"columns: {[c for c in data.column_names if c != EPOCH_COLUMN]})"
            )
        for c in self.key:
            nulls = data.column(c).null_count
            if nulls:
                raise BadInputError(
                    f"sink {self.sink!r}: {nulls} rows of the stage's output have a null key "
                    f"column {c!r}; an upsert needs every key column"
                )
        ranked = data.append_column(_ROW, pa.array(range(data.num_rows), pa.int64()))
        order = [(self.order_by, "ascending")] if self.order_by else []
        order += [(EPOCH_COLUMN, "ascending"), (_ROW, "ascending")]
        ranked = ranked.take(pc.sort_indices(ranked, sort_keys=order))
        ranked = ranked.set_column(
            ranked.schema.get_field_index(_ROW), _ROW, pa.array(range(ranked.num_rows), pa.int64())
        )
        last = ranked.group_by(list(self.key), use_threads=False).aggregate([(_ROW, "max")])
        rows = last.column(f"{_ROW}_max")  # each key's latest row's position in ``ranked``
        return ranked.take(pc.take(rows, pc.sort_indices(rows))).drop_columns([_ROW])
