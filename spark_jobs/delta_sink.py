"""The Delta sink: exactly-once by two-phase commit, or at-least-once.

Pre-commit: each subtask stages its micro-batch output (epoch *e*) as Parquet under
``<warehouse>/staging/<job>/<sink>/epoch=<e>/``. Commit (when checkpoint *n* completes): every
staged epoch up to the checkpoint's epoch is appended to the Delta table in one write tagged
``txnAppId = cutline-sink-<job>-<sink>``, ``txnVersion = <last epoch>``; Delta ignores a write whose
version it has already seen, so a commit repeated after a crash is a no-op. Staged epochs at or
below the table's committed version are leftovers of a commit that landed and are dropped.
On restore from checkpoint *k*, epoch *k*'s commit is redone (a no-op if it had landed) and staged
epochs after *k* are discarded: they will be recomputed.

At-least-once: every micro-batch's output is appended right away without a transaction id, so a
replay after a restore appends it again (duplicates, never losses).
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from spark_jobs.job import DeltaSink
from spark_jobs.subtask import staging_dir


class DeltaSinkWriter:
    def __init__(self, spark, job_id: str, sink: DeltaSink, warehouse: str | Path) -> None:
        self.spark = spark
        self.job_id = job_id
        self.sink = sink
        self.table_path = str(Path(warehouse) / "tables" / sink.table)
        self.staging_root = str(Path(warehouse) / "staging")
        self.app_id = f"cutline-sink-{job_id}-{sink.name}"
        self._lock = threading.Lock()

    def _epoch_dir(self, epoch: int) -> Path:
        return staging_dir(self.staging_root, self.job_id, self.sink.name, epoch)

    def staged_epochs(self) -> list[int]:
        root = self._epoch_dir(0).parent
        if not root.is_dir():
            return []
        return sorted(int(p.name.split("=", 1)[1]) for p in root.glob("epoch=*"))

    def committed_version(self) -> int:
        """The last epoch committed to the table (-1 if none)."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            version = DeltaTable(self.table_path).transaction_version(self.app_id)
        except TableNotFoundError:
            return -1
        return -1 if version is None else int(version)

    def _files(self, epochs: list[int]) -> list[str]:
        return [str(f) for e in epochs for f in sorted(self._epoch_dir(e).glob("part-*.parquet"))]

    def commit_through(self, epoch: int) -> int:
        """Commit every staged epoch <= ``epoch`` exactly once; returns rows committed."""
        with self._lock:
            committed = self.committed_version()
            staged = [e for e in self.staged_epochs() if e <= epoch]
            todo = [e for e in staged if e > committed]
            rows = 0
            files = self._files(todo)
            if files:
                df = self.spark.read.parquet(*files)
                rows = df.count()
                (
                    df.write.format("delta")
                    .mode("append")
                    .option("txnAppId", self.app_id)
                    .option("txnVersion", str(max(todo)))
                    .save(self.table_path)
                )
            for e in staged:
                shutil.rmtree(self._epoch_dir(e), ignore_errors=True)
            return rows

    def append_now(self, epoch: int) -> int:
        """At-least-once: append epoch ``epoch``'s output immediately, without a transaction."""
        with self._lock:
            files = self._files([epoch])
            rows = 0
            if files:
                df = self.spark.read.parquet(*files)
                rows = df.count()
                df.write.format("delta").mode("append").save(self.table_path)
            shutil.rmtree(self._epoch_dir(epoch), ignore_errors=True)
            return rows

    def discard_after(self, epoch: int) -> list[int]:
        """Drop staged epochs after ``epoch`` (they are recomputed after a restore)."""
        dropped = [e for e in self.staged_epochs() if e > epoch]
        for e in dropped:
            shutil.rmtree(self._epoch_dir(e), ignore_errors=True)
        return dropped
