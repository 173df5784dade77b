"""The Delta sink: each epoch's output appended to a Delta table, exactly once by two-phase
commit, or at least once.

Pre-commit: each subtask stages its micro-batch output (epoch *e*) apart per attempt
(cutline/sinks/staging.py).

Commit (when checkpoint *n* completes): the staged epochs up to *n*'s epoch are appended (no rows
if they had no output) in one conditional delta-rs commit (planned on one table version, never
retried blindly) that records
two Delta app transactions, ``cutline-sink-<job>-<sink>`` = the last committed epoch and
``cutline-fence-<job>-<sink>`` = the committing attempt. A commit is planned only if no newer
attempt has fenced the table (:class:`FencedError`) and only for epochs above the committed one,
so a commit redone after a crash commits nothing twice. Every attempt fences the table when it
starts (:meth:`DeltaSinkWriter.fence`, creating the table if it does not exist yet).

Each commit also records, in its commit info (``cutline``), the source positions at the end of
every epoch it commits, so the history says where each committed epoch ended. A restore from a
checkpoint older than the committed epoch (a fallback past damaged checkpoints) replays those
epochs exactly, producing no output for them (spark_jobs/driver/restore_fallback.py).

At-least-once: every micro-batch's output is appended right away (fenced the same way), so a
replay after a restore appends it again: duplicates, never losses.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cutline.sinks.base import Sink, SinkWriter
from cutline.sinks.staging import EPOCH_COLUMN, StagedEpochs
from cutline.validation import check_name
from state.catalog import FencedError
from state.faults import kill_point
from state.manifest import Positions
from state.storage.tables import (
    COMMIT_TOKEN,
    TABLE_PROPERTIES,
    LatestTable,
    committed_since,
    find_table,
    table_uri,
    write_table,
)

_TRIES = 40


@dataclass(frozen=True)
class DeltaSink(Sink):
    """A Delta table under the output root, ``<output>/<table>``, to which every epoch's
    output of stage ``stage`` (default: the job's last stage) is appended, each row with its
    epoch (``_epoch``)."""

    name: str
    table: str
    stage: str | None = None

    def __post_init__(self) -> None:
        check_name("sink.name", self.name)
        check_name("sink.table", self.table)

    @property
    def target(self) -> str:
        return f"Delta table {self.table!r}"

    def writer(self, job_id: str, attempt: int, *, output: str, staging: str) -> SinkWriter:
        return DeltaSinkWriter(job_id, self.name, self.table, output, staging, attempt)


class DeltaSinkWriter:
    """One Delta table appended to by one attempt of a job: a
    :class:`~cutline.sinks.base.SinkWriter`."""

    def __init__(
        self, job_id: str, sink: str, table: str, output: str, staging: str, attempt: int
    ) -> None:
        self.job_id, self.sink, self.attempt = job_id, sink, attempt
        self.table_path = table_uri(output, table)
        self._handle = LatestTable(self.table_path)  # read and committed at its newest version
        self.staged = StagedEpochs(staging, job_id, sink, attempt)
        self.epoch_app = f"cutline-sink-{job_id}-{sink}"
        self.fence_app = f"cutline-fence-{job_id}-{sink}"
        self._lock = threading.Lock()
        self.conflicts_retried = 0  # commits planned again after a concurrent commit

    # -- reading the table ------------------------------------------------------------------

    def committed_epoch(self) -> int:
        """The last epoch committed to the table (-1 if none)."""
        with self._handle.find() as dt:
            version = dt.transaction_version(self.epoch_app) if dt is not None else None
        return -1 if version is None else int(version)

    def has_output(self) -> bool:
        """Whether the table holds any row."""
        with self._handle.find() as dt:
            if dt is None:
                return False
            actions = dt.get_add_actions(flatten=True)
        return actions.num_rows > 0 and (
            "num_records" not in actions.column_names
            or any((n or 0) > 0 for n in actions.column("num_records").to_pylist())
        )

    def committed_ends(self, after: int) -> dict[int, Positions]:
        """Source positions at the end of each committed epoch above ``after``, from the commit
        infos. Raises ``LookupError`` naming the epochs the history does not cover."""
        committed = self.committed_epoch()
        wanted = set(range(after + 1, committed + 1))
        found = self._from_history("epochs", wanted)
        missing = sorted(wanted - found.keys())
        if missing:
            raise LookupError(
                f"{self.table_path}: the commit history does not say where epochs "
                f"{missing[0]}..{missing[-1]} ended"
            )
        return {e: found[e] for e in sorted(wanted)}

    def committed_times(self, after: int) -> dict[int, int]:
        """The planned processing time of each committed epoch above ``after`` whose commit
        recorded it (commits of older Cutlines did not)."""
        wanted = set(range(after + 1, self.committed_epoch() + 1))
        return {int(e): int(t) for e, t in sorted(self._from_history("times", wanted).items())}

    def _from_history(self, key: str, wanted: set[int]) -> dict[int, Any]:
        """The entries for ``wanted`` epochs of the commit infos' ``key`` map, newest first
        until all are found or the history ends."""
        if not wanted:
            return {}
        found: dict[int, Any] = {}
        limit = 64
        while True:
            with self._handle.latest() as dt:
                history = dt.history(limit)
            for entry in history:
                info = entry.get("cutline")
                if not info:
                    continue
                for epoch, value in json.loads(info).get(key, {}).items():
                    if int(epoch) in wanted:
                        found[int(epoch)] = value
            if wanted <= found.keys() or len(history) < limit:
                break
            limit *= 8
        return found

    def discard_other_attempts(self) -> None:
        """Drop what other attempts staged (after a restore redid its commit): older attempts'
        output is recomputed, never committed by this one."""
        self.staged.discard_other_attempts()

    # -- committing --------------------------------------------------------------------------

    def fence(self) -> None:
        """Fence the table for this attempt (creating it if missing): from now on no older
        attempt commits to it. Raises :class:`FencedError` if a newer attempt fenced it."""
        self._conditional_commit(lambda committed: (None, None, None))

    def commit_through(
        self,
        epoch: int,
        ends: dict[int, Positions],
        *,
        staged_by: int | None = None,
        times: dict[int, int] | None = None,
    ) -> int:
        """Commit every epoch up to ``epoch`` that attempt ``staged_by`` (default: this one)
        staged and the table lacks, with the end positions and planned processing times of the
        epochs it covers (``ends``, ``times``); returns the rows committed. Epochs without
        output are committed too (a commit of no rows), so the table's history says where every
        committed epoch ended. Repeating it commits nothing twice."""
        attempt = self.attempt if staged_by is None else staged_by
        parts = self.staged.parts(attempt)  # listed once for the read and the drop
        staged = [e for e in sorted(parts) if e <= epoch]
        everything = self.staged.read(staged, attempt, parts)  # each try takes what is new

        def plan(committed):
            if epoch <= committed:
                return None, None, 0
            data = None
            if everything is not None:
                data = everything.filter(pc.greater(everything[EPOCH_COLUMN], committed))
            rows = data.num_rows if data is not None else 0
            covered = {str(e): ends[e] for e in sorted(ends) if committed < e <= epoch}
            clock = {str(e): t for e, t in sorted((times or {}).items()) if committed < e <= epoch}
            info = {"attempt": self.attempt, "epochs": covered, "rows": rows, "times": clock}
            return (data if rows else None), (epoch, info), rows

        with self._lock:
            rows = self._conditional_commit(plan)
            self.staged.drop(staged, attempt, parts)
        return rows

    def append_now(
        self, epoch: int, ends: dict[int, Positions], times: dict[int, int] | None = None
    ) -> int:
        """At-least-once: append epoch ``epoch``'s output immediately (no skip of replays)."""

        parts = self.staged.parts()
        data = self.staged.read([epoch], parts=parts)

        def plan(committed):
            if data is None:
                return None, None, 0
            info = {"attempt": self.attempt, "epochs": {str(epoch): ends.get(epoch, {})}}
            if times and epoch in times:
                info["times"] = {str(epoch): times[epoch]}
            return data, (max(epoch, committed), info), data.num_rows

        with self._lock:
            rows = self._conditional_commit(plan)
            self.staged.drop([epoch], parts=parts)
        return rows

    def reset(self) -> int:
        """Delete every row (an explicit start-over); returns how many there were."""
        from deltalake import CommitProperties, Transaction

        with self._handle.find() as dt:
            if dt is None:
                return 0
            metrics = dt.delete(
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(self.fence_app, self.attempt)]
                )
            )
        return int(metrics.get("num_deleted_rows", 0) or 0)

    def upkeep(self) -> None:
        """The table's expired log entries removed, at most every five minutes (no commit
        lists the whole log to do it: ``TABLE_PROPERTIES``)."""
        self._handle.clean_log()

    def _conditional_commit(self, plan) -> Any:
        """Plan a commit on one version of the table and land it only on that version; a
        concurrent commit makes it start over. ``plan(committed epoch)`` returns ``(data,
        (epoch, info) | None, result)``; ``data=None`` with no epoch commits only the fence when
        this attempt has not fenced the table yet."""
        for tries in range(_TRIES):
            with self._handle.find() as dt:
                landed, result = (False, None) if dt is None else self._commit_on(dt, plan)
            if landed:
                return result
            if dt is None:
                self._create()
                continue
            self.conflicts_retried += 1
            time.sleep(min(2.0, 0.02 * 2**tries) * random.uniform(0.5, 1.5))
        raise RuntimeError(f"{self.table_path}: no conditional commit landed in {_TRIES} tries")

    def _commit_on(self, dt, plan) -> tuple[bool, Any]:
        """One try of :meth:`_conditional_commit` on ``dt``'s version: ``(landed, result)``."""
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError

        fence = dt.transaction_version(self.fence_app) or 0
        if fence > self.attempt:
            raise FencedError(
                f"attempt {self.attempt} of {self.job_id} is fenced from sink {self.sink!r}: "
                f"attempt {fence} started"
            )
        recorded = dt.transaction_version(self.epoch_app)
        committed = -1 if recorded is None else int(recorded)
        data, commit, result = plan(committed)
        if data is None and commit is None and fence == self.attempt:
            return True, result
        transactions = [Transaction(self.fence_app, self.attempt)]
        token = uuid.uuid4().hex  # a commit whose answer was lost is recognised by it
        metadata = {COMMIT_TOKEN: token}
        if commit is not None:
            transactions.append(Transaction(self.epoch_app, int(commit[0])))
            metadata["cutline"] = json.dumps(commit[1], sort_keys=True)
        if data is None:
            data = pa.table({EPOCH_COLUMN: pa.array([], pa.int64())})
        first_data = data.num_rows > 0 and [f.name for f in dt.schema().fields] == [EPOCH_COLUMN]
        kill_point("sink-committing")
        properties = CommitProperties(
            max_commit_retries=0, app_transactions=transactions, custom_metadata=metadata
        )
        try:
            self._write(dt, data, first_data, properties)
        except CommitFailedError:
            if not committed_since(self.table_path, dt.version(), token):
                return False, None
        kill_point("sink-committed")
        return True, result

    def _write(self, dt, data: pa.Table, first: bool, properties) -> None:
        """Land ``data`` (maybe no rows) in one commit with ``properties``, planned on ``dt``'s
        version; ``first``: the table has only the epoch column yet, so ``data``'s schema
        replaces it. The append sink appends."""
        write_table(
            dt,
            data,
            mode="overwrite" if first else "append",
            schema_mode="overwrite" if first else "merge",
            commit_properties=properties,
        )

    def _create(self) -> None:
        """An empty table holding only the epoch column: the first commit with output replaces
        the schema with the output's (so the table exists, and can be fenced, before any output)."""
        try:
            write_table(
                self.table_path,
                pa.table({EPOCH_COLUMN: pa.array([], pa.int64())}),
                mode="append",
                configuration=TABLE_PROPERTIES,
            )
        except Exception:
            if find_table(self.table_path) is None:  # lost a creation race: fine once it exists
                raise
