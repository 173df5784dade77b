"""Where a two-phase sink's subtasks stage each epoch's output before the commit.

The staging root is durable storage every process reaches (a local path in a one-host
deployment, ``s3://`` on a cluster): executors write the parts, the driver reads and commits
them; neither touches the other's disk. Attempt ``a`` of job ``j`` stages epoch ``e`` of sink
``s`` as Parquet parts ``<root>/<j>/<s>/a<a>/epoch=<e>/<part>.parquet``, one part per (subtask,
stage); a part is written in one atomic put, so it is either whole or absent. Every attempt
stages apart: an older attempt that still runs can never add files to what a newer one commits.
Each staged row carries its epoch (:data:`EPOCH_COLUMN`).
"""

from __future__ import annotations

import pyarrow as pa

from state.storage import DurableStorage, open_storage

EPOCH_COLUMN = "_epoch"
_PART = ".parquet"


class StagedEpochs:
    """One attempt's staged epochs of one sink of one job, under the staging root ``root``."""

    def __init__(self, root: str, job_id: str, sink: str, attempt: int) -> None:
        self.root = str(root)
        self.sink_prefix = f"{job_id}/{sink}"
        self.attempt = int(attempt)
        self.storage: DurableStorage = open_storage(self.root)

    def _attempt_prefix(self, attempt: int | None) -> str:
        return f"{self.sink_prefix}/a{self.attempt if attempt is None else int(attempt)}"

    def directory(self, epoch: int, attempt: int | None = None) -> str:
        """Where ``attempt`` (default: this one) stages epoch ``epoch``, relative to the root."""
        return f"{self._attempt_prefix(attempt)}/epoch={int(epoch)}"

    def write(self, epoch: int, part: str, output: pa.Table) -> None:
        """Stage ``output`` (the runtime's ``_`` columns dropped, the epoch added) as part
        ``part`` of ``epoch``; nothing for no rows."""
        import pyarrow.parquet as pq

        if output.num_rows == 0:
            return
        output = output.select([c for c in output.column_names if not c.startswith("_")])
        output = output.append_column(EPOCH_COLUMN, pa.array([epoch] * output.num_rows, pa.int64()))
        buffer = pa.BufferOutputStream()
        pq.write_table(output, buffer)
        self.storage.put_bytes(
            f"{self.directory(epoch)}/{part}{_PART}", buffer.getvalue().to_pybytes()
        )

    def parts(self, attempt: int | None = None) -> dict[int, list[str]]:
        """The staged parts of ``attempt`` (default: this one), by epoch, each epoch's in part
        order: one listing, which :meth:`read` and :meth:`drop` can take instead of their own."""
        parts: dict[int, list[str]] = {}
        prefix = self._attempt_prefix(attempt)
        for info in self.storage.list(prefix):
            directory, _, name = info.path[len(prefix) + 1 :].partition("/")
            if directory.startswith("epoch=") and name.endswith(_PART) and "/" not in name:
                parts.setdefault(int(directory.split("=", 1)[1]), []).append(info.path)
        return {e: sorted(paths) for e, paths in parts.items()}

    def epochs(self, attempt: int | None = None) -> list[int]:
        """The epochs ``attempt`` (default: this one) staged, ascending."""
        return sorted(self.parts(attempt))

    def read(
        self,
        epochs: list[int],
        attempt: int | None = None,
        parts: dict[int, list[str]] | None = None,
    ) -> pa.Table | None:
        """The staged rows of ``epochs`` in epoch order, then part order, then row order (None
        if there are none)."""
        import pyarrow.parquet as pq

        staged = self.parts(attempt) if parts is None else parts
        files = [path for e in sorted(epochs) for path in staged.get(e, [])]
        if not files:
            return None
        tables = [pq.read_table(pa.BufferReader(self.storage.get_bytes(f))) for f in files]
        return pa.concat_tables(tables, promote_options="permissive").combine_chunks()

    def drop(
        self,
        epochs: list[int],
        attempt: int | None = None,
        parts: dict[int, list[str]] | None = None,
    ) -> None:
        """Delete what ``attempt`` staged for ``epochs``."""
        staged = self.parts(attempt) if parts is None else parts
        self.storage.delete_many(path for e in epochs for path in staged.get(e, []))

    def discard_other_attempts(self) -> None:
        """Drop what other attempts staged: their output is recomputed, never committed by
        this one."""
        mine = self._attempt_prefix(None) + "/"
        others = [
            info.path
            for info in self.storage.list(self.sink_prefix)
            if not info.path.startswith(mine)
        ]
        self.storage.delete_many(others)
