"""Test a stage's :class:`~cutline.KeyedProcessFunction`, or a job's chain of stages, in-process:
no Spark, the runtime's own state code (RocksDB in a temporary directory, the same operator,
snapshot and local-first restore), milliseconds per call.

>>> with Harness(sessions()) as h:
...     h.process([{"user": "a", "url": "/", "ts": 1_000}])
...     out = h.advance_watermark(60_000)   # fires the event-time timers due by then

Each call is one micro-batch of every subtask (one owning every key group unless the harness
has a ``parallelism``), in the runtime's order:
TTL cleanup, the timers due (event-time ones at or before the watermark as of the previous
call, processing-time ones at or before the processing time), then ``process_batch`` with the
records. Records are Arrow tables, pandas frames or lists of dicts; a two-input stage takes a
dict of them by input name. Unless the test sets it, a stage's watermark follows the runtime's
rule over its inputs: the smallest of their largest event times seen, less the stage's
``out_of_orderness_ms``, never going back. A job's transforms (Spark DataFrame functions) do not
run: give the records as the first stage reads them.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from cutline.job import JobDefinition, KeyedProcess
from cutline.keyed_process import SOURCE_COLUMN, ProcessOperator, key_columns
from cutline.routing import key_array, read_chunks, rekey, sort_in_log_order
from cutline.testing.inspection import registered_timers, state_entries
from cutline.testing.records import HARNESS_JOB, Rows, as_table, chain_job, tagged
from cutline.testing.snapshots import HarnessSnapshot, restore_stores, snapshot_stores
from state.handles import SubtaskStateHandle
from state.keygroups import key_group_range, key_groups, subtask_for_key_group
from state.local_copies import LocalCopies
from state.rocksdb_store import RocksDBStore
from state.state_types import KeyCodec
from state.storage import LocalFileStorage
from state.user_state import ListState, MapState, ValueState, open_view
from state.write_buffer import BufferedTransaction


class InjectedFailure(RuntimeError):
    """A micro-batch the test failed on purpose (``process(..., fail_after=stage)``)."""


class Harness:
    """One stage (a :class:`~cutline.KeyedProcess`) or a job's chain of stages, run in-process.

    ``parallelism``: the stages' subtasks, each owning its key groups, with each key's records
    routed to its subtask as on Spark. ``restore``: start from a snapshot (of this or another
    harness of a compatible job: the function's code may differ, as after an upgrade), at
    ``parallelism``, rescaled as a restore on Spark is. ``directory``: where the state lives
    (default: a temporary directory, removed by :meth:`close`)."""

    def __init__(
        self,
        stages: KeyedProcess | JobDefinition | Sequence[KeyedProcess],
        *,
        parallelism: int = 1,
        processing_time: int = 0,
        restore: HarnessSnapshot | None = None,
        directory: str | Path | None = None,
    ) -> None:
        if not isinstance(stages, JobDefinition):  # validated as a job's chain would be
            chain = (stages,) if isinstance(stages, KeyedProcess) else tuple(stages)
            stages = chain_job(chain)
        self.job = dataclasses.replace(stages, parallelism=parallelism)
        self.stages: tuple[KeyedProcess, ...] = self.job.stages
        self.max_parallelism = self.job.max_parallelism
        self._temporary = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="cutline-harness-"))
        self.storage = LocalFileStorage(self.directory / "checkpoints")
        self.processing_time = processing_time
        self.watermarks: dict[str, int] = {}
        self.event_times: dict[str, dict[str, int]] = {s.uid: {} for s in self.stages}
        self.outputs: dict[str, pa.Table] = {}  # per stage name: its last micro-batch's output
        # per stage name: (micro-batch number, output) of every micro-batch since the start
        self._collected: dict[str, list[tuple[int, pa.Table]]] = {s.name: [] for s in self.stages}
        self._batches = 0
        self._failed: str | None = None  # an injected failure not yet followed by a restore
        self._operators = {s.uid: ProcessOperator(s, self.max_parallelism) for s in self.stages}
        self._stores: dict[str, list[RocksDBStore]] = {}  # per stage uid, one per subtask
        self._handles: dict[str, tuple[SubtaskStateHandle, ...]] = {}
        self._checkpoint_id = 0
        self._open(restore)

    # -- micro-batches ---------------------------------------------------------------------

    def process(
        self,
        records: Rows | Mapping[str, Rows],
        *,
        processing_time: int | None = None,
        fail_after: str | None = None,
    ) -> pa.Table:
        """One micro-batch of ``records`` (for a job that reads several sources: a dict by
        source name, whichever stage reads it) through every stage; returns the last stage's
        output (every stage's is in :attr:`outputs`). ``processing_time`` moves the processing
        clock first. ``fail_after`` (a stage's name): the micro-batch fails once that stage has
        applied it, its state written and the stages after it not run
        (:class:`InjectedFailure`); as after any failure, :meth:`restore` a snapshot and
        replay the records since."""
        if processing_time is not None:
            self.set_processing_time(processing_time, fire=False)
        sources = list(self.job.source_inputs)
        if not isinstance(records, Mapping):
            if len(sources) != 1:
                raise ValueError(f"the job reads sources {sources}: pass a dict of records by name")
            records = {sources[0]: records}
        unknown = sorted(set(records) - set(sources))
        if unknown:
            raise ValueError(f"the job reads no source(s) {unknown}; its sources are {sources}")
        tables = {name: tagged(as_table(rows), name) for name, rows in records.items()}
        return self._run({name: t for name, t in tables.items() if t.num_rows}, fail_after)

    def advance_watermark(self, watermark: int, stage: str | None = None) -> pa.Table:
        """Move the watermark of every stage (or of ``stage``, by name) to ``watermark`` (it
        never goes back) and run a micro-batch without records: the event-time timers due by
        then fire and event-time TTL expires. Returns the last stage's output."""
        for s in self.stages:
            if stage is None or s.name == stage:
                self.watermarks[s.uid] = max(self.watermarks.get(s.uid, watermark), watermark)
        return self._run({})

    def set_processing_time(self, ms: int, *, fire: bool = True) -> pa.Table:
        """Move the processing clock to ``ms`` (never back); with ``fire``, run a micro-batch
        without records so the processing-time timers due by then fire and processing-time TTL
        expires. Returns the last stage's output."""
        if ms < self.processing_time:
            raise ValueError(f"processing time goes back: {ms} < {self.processing_time}")
        self.processing_time = ms
        return self._run({}) if fire else pa.table({})

    def _run(self, sources: Mapping[str, pa.Table], fail_after: str | None = None) -> pa.Table:
        """One micro-batch: each stage's input, as the runtime routes it (the sources it reads,
        the outputs of the stages it reads), in the runtime's order; its outputs collected
        once every stage ran."""
        if self._failed is not None:
            raise RuntimeError(f"{self._failed}: restore a snapshot before the next micro-batch")
        if fail_after is not None and fail_after not in {s.name for s in self.stages}:
            raise ValueError(f"no stage {fail_after!r} to fail after")
        output = pa.table({})
        for i, stage in enumerate(self.stages):
            tables = []
            for name in stage.inputs:
                if name in sources:
                    tables.append(sources[name])
                elif name in self.outputs and i > 0:
                    tables.extend(self._rekeyed(self.outputs[name], i, name))
            if tables:
                table = sort_in_log_order(pa.concat_tables(tables, promote_options="permissive"))
            else:
                table = pa.table(
                    {c: pa.array([], pa.string()) for c in key_columns(stage.key_column)}
                )
            output = self._apply(stage, table)
            self.outputs[stage.name] = output
            if stage.name == fail_after:
                self._failed = f"micro-batch {self._batches} failed after stage {stage.name!r}"
                raise InjectedFailure(self._failed)
        for stage in self.stages:
            self._collected[stage.name].append((self._batches, self.outputs[stage.name]))
        self._batches += 1
        return output

    def collected(self, stage: str | None = None) -> pa.Table:
        """Every micro-batch's output of ``stage`` (by name; default: the last stage) since the
        harness started, in order, with its ``micro_batch`` number: what a sink would hold. A
        :meth:`restore` drops what the micro-batches after its snapshot emitted, as a restart
        discards output not committed with a checkpoint."""
        name = self._stage_named(stage).name
        parts = [
            t.append_column("micro_batch", pa.array([n] * t.num_rows, pa.int64()))
            for n, t in self._collected[name]
            if t.num_rows
        ]
        if not parts:
            return pa.table({"micro_batch": pa.array([], pa.int64())})
        return pa.concat_tables(parts, promote_options="permissive")

    @property
    def parallelism(self) -> int:
        return self.job.parallelism

    def _apply(self, stage: KeyedProcess, table: pa.Table) -> pa.Table:
        """The micro-batch on every subtask of ``stage`` (each key's records on the subtask
        owning its key group, as Spark routes them; every subtask runs, for its timers and
        TTL); the outputs in subtask order."""
        parts = [table] * self.parallelism
        if self.parallelism > 1 and table.num_rows:
            groups = key_groups(key_array(table, stage.key_column), stage.key_type,
                                self.max_parallelism)  # fmt: skip
            owner = subtask_for_key_group(groups, self.parallelism, self.max_parallelism)
            parts = [table.filter(pa.array(owner == i)) for i in range(self.parallelism)]
        outputs = []
        for store, part in zip(self._stores[stage.uid], parts, strict=True):
            result = self._operators[stage.uid].apply(
                store, part, self.watermarks.get(stage.uid), self.processing_time
            )
            result.txn.commit()
            outputs.append(result.output)
        self._follow_event_time(stage, table)
        produced = [o for o in outputs if o.num_rows]
        if len(produced) <= 1:
            return produced[0] if produced else outputs[0]
        return pa.concat_tables(produced, promote_options="permissive")

    def _follow_event_time(self, stage: KeyedProcess, table: pa.Table) -> None:
        """The runtime's watermark rule, one partition per input."""
        if (
            not stage.event_time
            or table.num_rows == 0
            or stage.event_time not in table.column_names
        ):
            return
        seen = self.event_times[stage.uid]
        inputs = table.column(SOURCE_COLUMN) if SOURCE_COLUMN in table.column_names else None
        for name in stage.inputs:
            rows = table if inputs is None else table.filter(pc.equal(inputs, name))
            high = pc.max(rows.column(stage.event_time)).as_py() if rows.num_rows else None
            if high is not None:
                seen[name] = max(seen.get(name, high), int(high))
        if seen:
            candidate = min(seen.values()) - stage.out_of_orderness_ms
            self.watermarks[stage.uid] = max(self.watermarks.get(stage.uid, candidate), candidate)

    def _rekeyed(self, output: pa.Table, i: int, producer: str) -> list[pa.Table]:
        """Stage ``producer``'s output as stage ``i`` reads it, routed by the runtime's code."""
        index = next(j for j, s in enumerate(self.stages) if s.name == producer)
        chunks = [chunk for _, chunk in rekey(output, self.job, i, 0, producer=index)]
        return [read_chunks(chunks, None)] if chunks else []

    # -- state -----------------------------------------------------------------------------

    def state(self, name: str, stage: str | None = None) -> ValueState | ListState | MapState:
        """A read view of state ``name`` of ``stage`` (by name; default: the only or first
        stage that declares it), as the function's context gives it: ``.get(keys)`` etc.
        Writes through it are not kept. Parallelism 1 only (:meth:`entries` reads every
        subtask)."""
        if self.parallelism != 1:
            raise ValueError("h.state() reads one subtask: at parallelism > 1 use h.entries()")
        spec = self._stage(stage, name)
        specs = {s.name: s for s in spec.function.states}
        keys = KeyCodec(spec.key_type, self.max_parallelism, key_columns(spec.key_column))
        clocks = {"processing": self.processing_time}
        if spec.uid in self.watermarks:
            clocks["event"] = self.watermarks[spec.uid]
        txn = BufferedTransaction(self._stores[spec.uid][0])
        return open_view(specs[name], txn, keys, clocks)

    def entries(self, name: str, stage: str | None = None) -> pa.Table:
        """Every entry of state ``name`` over every subtask, without knowing the keys: the
        columns ``cutline state read`` gives (the key's, ``key_group``, then ``value``, a row
        per list element or map entry, ``expires_at_ms`` with a TTL; entries expired but not
        yet cleaned up included), as of the last micro-batch."""
        s = self._stage(stage, name)
        return state_entries(self._stores[s.uid], s, name, self.max_parallelism)

    def keys(self, name: str, stage: str | None = None) -> pa.Table:
        """The keys that have an entry of state ``name`` (their key columns, sorted)."""
        columns = list(key_columns(self._stage(stage, name).key_column))
        table = self.entries(name, stage).select(columns).group_by(columns).aggregate([])
        return table.sort_by([(c, "ascending") for c in columns])

    def count(self, name: str, stage: str | None = None) -> int:
        """How many entries state ``name`` holds (a value per key, a list's elements, a map's
        entries), as :meth:`entries` lists them."""
        return self.entries(name, stage).num_rows

    def timers(self, stage: str | None = None) -> pa.Table:
        """The timers registered and not fired of ``stage`` (by name; default: the last
        stage), over every subtask: its key column(s), ``timestamp`` and ``domain`` ("event"
        or "processing"), in timestamp order."""
        s = self._stage_named(stage)
        return registered_timers(self._stores[s.uid], s, self.max_parallelism)

    def _stage_named(self, stage: str | None) -> KeyedProcess:
        for s in self.stages:
            if s.name == (stage or self.stages[-1].name):
                return s
        raise KeyError(f"no stage {stage!r} (the stages: {[s.name for s in self.stages]})")

    def _stage(self, stage: str | None, state: str) -> KeyedProcess:
        for s in self.stages:
            if (stage is None or s.name == stage) and any(
                x.name == state for x in s.function.states
            ):
                return s
        where = f"stage {stage!r}" if stage else "no stage"
        raise KeyError(f"{where} declares a state {state!r}")

    # -- snapshot and restore --------------------------------------------------------------

    def snapshot(self) -> HarnessSnapshot:
        """A checkpoint of every stage, taken as the runtime takes one (incremental on the
        previous snapshot, with a local copy); the harness goes on running."""
        self._checkpoint_id += 1
        cid = self._checkpoint_id
        handles = snapshot_stores(self.storage, self._stores, self._handles, cid, self._copies)
        self._handles = handles
        return HarnessSnapshot(
            cid,
            dict(handles),
            dict(self.watermarks),
            {uid: dict(seen) for uid, seen in self.event_times.items()},
            self.processing_time,
            self.directory,
            self._batches,
        )

    def restore(self, snapshot: HarnessSnapshot, parallelism: int | None = None) -> None:
        """Roll every stage back to ``snapshot`` (as a restart after a failure does), at
        ``parallelism`` (default: the harness's): another than the snapshot's rescales the
        state by key group with the runtime's own code (state/rescale.py)."""
        self._close_stores()
        if parallelism is not None:
            self.job = dataclasses.replace(self.job, parallelism=parallelism)
        self._open(snapshot)

    def _open(self, snapshot: HarnessSnapshot | None) -> None:
        if snapshot is not None:
            uids = [s.uid for s in self.stages]
            restore_stores(snapshot, uids, self.parallelism, self.max_parallelism, self._copies)
            self.watermarks = dict(snapshot.watermarks)
            self.event_times = {
                s.uid: dict(snapshot.event_times.get(s.uid, {})) for s in self.stages
            }
            self.processing_time = snapshot.processing_time
            self._checkpoint_id = max(self._checkpoint_id, snapshot.checkpoint_id)
            self._batches = snapshot.batches
            for name, batches in self._collected.items():  # output after it is not committed
                self._collected[name] = [(n, t) for n, t in batches if n < snapshot.batches]
            self._failed = None
            # the next snapshot is incremental on it, unless the subtasks changed
            same = snapshot.directory == self.directory and (
                snapshot.parallelism == self.parallelism
            )
            self._handles = dict(snapshot.handles) if same else {}
        for stage in self.stages:
            self._stores[stage.uid] = [
                RocksDBStore(
                    self._copies(stage.uid, i).db_dir,
                    key_group_range(i, self.parallelism, self.max_parallelism),
                )
                for i in range(self.parallelism)
            ]

    def _copies(self, uid: str, subtask: int) -> LocalCopies:
        return LocalCopies(self.directory / "local", HARNESS_JOB, uid, subtask)

    # -- lifecycle -------------------------------------------------------------------------

    def _close_stores(self) -> None:
        for stores in self._stores.values():
            for store in stores:
                store.close()
        self._stores = {}

    def close(self) -> None:
        """Close the stores; a temporary directory is removed."""
        self._close_stores()
        if self._temporary:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
