"""Where a two-phase sink's subtasks stage each epoch's output before the commit.

Attempt ``a`` of job ``j`` stages epoch ``e`` of sink ``s`` as Parquet parts under
``<root>/<j>/<s>/a<a>/epoch=<e>/``, one part per (subtask, stage), each written to a temporary
name and renamed, so a part is either whole or absent. Every attempt stages apart: an older
attempt that still runs can never add files to what a newer one commits. Each staged row carries
its epoch (:data:`EPOCH_COLUMN`).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pyarrow as pa

EPOCH_COLUMN = "_epoch"


def staging_root(warehouse: str | Path) -> Path:
    """The staging root of a warehouse (every sink of every job stages under it)."""
    return Path(warehouse) / "staging"


class StagedEpochs:
    """One attempt's staged epochs of one sink of one job."""

    def __init__(self, root: str | Path, job_id: str, sink: str, attempt: int) -> None:
        self.sink_root = Path(root) / job_id / sink
        self.attempt = int(attempt)

    def directory(self, epoch: int, attempt: int | None = None) -> Path:
        """Where ``attempt`` (default: this one) stages epoch ``epoch``."""
        attempt = self.attempt if attempt is None else int(attempt)
        return self.sink_root / f"a{attempt}" / f"epoch={int(epoch)}"

    def write(self, epoch: int, part: str, output: pa.Table) -> None:
        """Stage ``output`` (the runtime's ``_`` columns dropped, the epoch added) as part
        ``part`` of ``epoch``; nothing for no rows."""
        import pyarrow.parquet as pq

        if output.num_rows == 0:
            return
        output = output.select([c for c in output.column_names if not c.startswith("_")])
        output = output.append_column(EPOCH_COLUMN, pa.array([epoch] * output.num_rows, pa.int64()))
        directory = self.directory(epoch)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".tmp-{uuid.uuid4().hex}"
        pq.write_table(output, tmp)
        os.replace(tmp, directory / f"{part}.parquet")

    def epochs(self, attempt: int | None = None) -> list[int]:
        """The epochs ``attempt`` (default: this one) staged, ascending."""
        root = self.directory(0, attempt).parent
        if not root.is_dir():
            return []
        return sorted(int(p.name.split("=", 1)[1]) for p in root.glob("epoch=*"))

    def read(self, epochs: list[int], attempt: int | None = None) -> pa.Table | None:
        """The staged rows of ``epochs`` in epoch order, then part order, then row order (None
        if there are none)."""
        import pyarrow.parquet as pq

        files = [f for e in epochs for f in sorted(self.directory(e, attempt).glob("*.parquet"))]
        if not files:
            return None
        return pa.concat_tables(
            [pq.read_table(f, partitioning=None) for f in files], promote_options="permissive"
        ).combine_chunks()

    def drop(self, epochs: list[int], attempt: int | None = None) -> None:
        for e in epochs:
            shutil.rmtree(self.directory(e, attempt), ignore_errors=True)

    def discard_other_attempts(self) -> None:
        """Drop what other attempts staged: their output is recomputed, never committed by
        this one."""
        if self.sink_root.is_dir():
            for directory in self.sink_root.glob("a*"):
                if directory.name != f"a{self.attempt}":
                    shutil.rmtree(directory, ignore_errors=True)
