"""Job definitions: sources, keyed stages, sinks, parallelism and checkpointing.

A job is declared once in Python; spark_jobs/job_loader.py finds it by name, by ``module:attr``
or through the ``cutline.jobs`` entry points of installed packages. Everything is validated at
definition time: a bad value raises :class:`JobDefinitionError` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cutline.keyed_process import Key, KeyedProcessFunction, key_columns
from cutline.sinks import DeltaSink, Sink
from cutline.sources import Source, SparkDependencies
from cutline.validation import JobDefinitionError
from cutline.validation import check_name as _check_name
from state.config import CheckpointConfig
from state.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    KEY_TYPES,
    KeyType,
    check_parallelism,
    key_types_of,
)

BAD_RECORD_POLICIES = ("fail", "dead_letter")
DEAD_LETTER_SINK = "dead_letters"


KEY_FINGERPRINT = "__key__"  # a stage's key types, beside its states' fingerprints (no state
# name starts with "_")


@dataclass(frozen=True)
class Transform:
    """A stateless step on one source's records before the first keyed stage: ``function`` is any
    ``DataFrame -> DataFrame`` (parse, filter, project, UDFs). It must be deterministic (a replay
    after a restore runs it again on the same records) and keep the runtime's columns, those
    whose names start with ``_`` (``withColumn``, ``where`` and ``select("*", ...)`` do). It sees
    only well-formed records; bad ones go to the job's bad-record policy untouched."""

    name: str
    source: str
    function: Callable[[Any], Any]

    def __post_init__(self) -> None:
        _check_name("transform.name", self.name)
        if not callable(self.function):
            raise JobDefinitionError(f"transform {self.name!r}: function must be callable")


def _check_stage(stage) -> None:
    """The stage's name and uid (the uid defaults to the name)."""
    _check_name("operator.name", stage.name)
    if not stage.uid:
        object.__setattr__(stage, "uid", stage.name)
    _check_name("operator.uid", stage.uid)


@dataclass(frozen=True)
class KeyedProcess:
    """A keyed stage running a :class:`KeyedProcessFunction` instance
    (cutline/keyed_process.py), the user's own or the library's (cutline/operators.py).
    ``inputs`` maps each input source to its key column (two inputs: both cut at the same
    barrier); a composite key is a tuple of columns, with ``key_type`` the tuple of their types
    (the function sees such keys as struct arrays: ``ctx.key_of(table)``). With ``event_time``,
    the stage's watermark drives event-time timers and event-time TTL. As Flink's, it is per
    input partition (a source's partition; for a later stage, an upstream subtask): the minimum
    over the partitions of their largest event time less ``out_of_orderness_ms``, never going
    back. A partition not yet seen does not hold it back; one without records for
    ``idle_timeout_ms`` (by the micro-batches' planned processing time) stops holding it back
    until it has records again; while every partition is idle it holds. ``idle_timeout_ms=None``
    never lets a partition go idle (Flink's default without ``withIdleness``: a partition that
    stops producing stalls every window). The default, 60 s, is the ``withIdleness`` duration of
    Flink's documentation: long next to a micro-batch and to a producer's pause, so a live but
    slow partition keeps holding the watermark (its records stay on time), and short enough that
    a dead partition delays windows by a minute, not forever. ``uid`` (default: ``name``)
    identifies the stage's state in checkpoints: keep it when renaming the stage."""

    name: str
    inputs: dict[str, Key]
    key_type: KeyType
    function: KeyedProcessFunction
    event_time: str | None = None
    out_of_orderness_ms: int = 0
    uid: str = ""
    idle_timeout_ms: int | None = 60_000

    def __post_init__(self) -> None:
        _check_stage(self)
        try:
            types = key_types_of(self.key_type)
        except ValueError:
            raise JobDefinitionError(
                f"operator.key_type must be one of {KEY_TYPES} or a tuple of them (a composite "
                f"key), got {self.key_type!r}"
            ) from None
        if not isinstance(self.key_type, str):
            object.__setattr__(self, "key_type", types)
        if not self.inputs or len(self.inputs) > 2:
            raise JobDefinitionError("operator.inputs must map one or two sources to key columns")
        composite = not isinstance(self.key_type, str)
        for source, key in self.inputs.items():
            if len(key_columns(key)) != len(types) or isinstance(key, str) == composite:
                raise JobDefinitionError(
                    f"operator {self.name!r}: input {source!r} is keyed by {key!r}, which does "
                    f"not match key_type {self.key_type!r} column for column"
                )
        inputs = {s: k if isinstance(k, str) else key_columns(k) for s, k in self.inputs.items()}
        object.__setattr__(self, "inputs", inputs)
        if not isinstance(self.function, KeyedProcessFunction):
            raise JobDefinitionError(
                f"operator.function must be a KeyedProcessFunction instance, got "
                f"{type(self.function).__name__}"
            )
        names = [s.name for s in self.function.states]
        if len(set(names)) != len(names):
            raise JobDefinitionError(f"operator {self.name!r}: state names repeat: {names}")
        if self.out_of_orderness_ms < 0:
            raise JobDefinitionError("operator.out_of_orderness_ms must be >= 0")
        idle = self.idle_timeout_ms
        if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int) or idle < 1):
            raise JobDefinitionError(
                f"operator {self.name!r}: idle_timeout_ms must be an integer >= 1 or None "
                f"(never idle), got {idle!r}"
            )
        event_ttl = [s.name for s in self.function.states if s.ttl and s.ttl.clock == "event"]
        if event_ttl and not self.event_time:
            raise JobDefinitionError(
                f"operator {self.name!r}: states {event_ttl} expire by event time, so the "
                "stage needs an event_time column"
            )

    @property
    def key_column(self) -> Key:
        """The key of the stage's first input: a column, or a composite key's columns."""
        return next(iter(self.inputs.values()))

    def state_schema(self) -> dict[str, str]:
        """Each state's fingerprint, and (under ``KEY_FINGERPRINT``) the key's types: what a
        checkpoint records and a restore checks (spark_jobs/driver/evolution.py)."""
        key = f"key<{','.join(key_types_of(self.key_type))}>"
        return {KEY_FINGERPRINT: key, **{s.name: s.fingerprint() for s in self.function.states}}

    def watermark_lag_ms(self) -> int | None:
        """How far the stage's watermark trails its largest event time; None: it has none."""
        return self.out_of_orderness_ms if self.event_time else None


Operator = KeyedProcess  # every stage; the library's are built by cutline/operators.py


@dataclass(frozen=True)
class JobDefinition:
    """A streaming job: ``sources``, optional stateless ``transforms`` of them, then ``operator``:
    one keyed stage, or a tuple of stages chained in order. The first stage reads sources;
    every later stage reads the output of the one before it, and may read sources and the
    outputs of earlier stages besides (a two-input stage anywhere in the chain: enrich a stage's
    totals with a profiles source), every input re-partitioned by the stage's key for it. Each
    source has one reader. ``sink``: one sink or several (:class:`~cutline.sinks.DeltaSink`
    appends, :class:`~cutline.sinks.DeltaUpsertSink` keeps the latest row per key, or any
    :class:`~cutline.sinks.Sink`), each taking one stage's output.
    Every stage's subtasks snapshot at the same micro-batch cut, after applying all their
    inputs' records of it; a checkpoint completes only with all of them."""

    name: str
    sources: tuple[Source, ...]
    operator: Operator | tuple[Operator, ...]
    sink: Sink | tuple[Sink, ...]
    checkpoint: CheckpointConfig
    parallelism: int = 2
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    description: str = ""
    tags: dict[str, Any] = field(default_factory=dict)
    # a record that cannot be processed: "fail" the attempt (naming it; not retried), or
    # "dead_letter": skip it into the Delta table ``dead_letter_table`` (default <job>_dead_letters)
    bad_records: str = "fail"
    dead_letter_table: str | None = None
    transforms: tuple[Transform, ...] = ()
    # the code's version (a release, a commit), recorded with every savepoint of the job
    version: str = ""

    def __post_init__(self) -> None:
        _check_name("job.name", self.name)
        if self.bad_records not in BAD_RECORD_POLICIES:
            raise JobDefinitionError(
                f"job.bad_records must be one of {BAD_RECORD_POLICIES}, got {self.bad_records!r}"
            )
        if self.dead_letter_table is not None:
            _check_name("job.dead_letter_table", self.dead_letter_table)
        try:
            check_parallelism(self.parallelism, self.max_parallelism)
        except ValueError as e:
            raise JobDefinitionError(f"job.{e}") from e
        if not self.sources:
            raise JobDefinitionError("job.sources must name at least one source")
        wrong = [s for s in self.sources if not isinstance(s, Source)]
        if wrong:
            raise JobDefinitionError(
                f"job.sources must be Sources (LogSource, KafkaSource, ...), got {wrong[0]!r}"
            )
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise JobDefinitionError(f"job.sources names must be unique, got {names}")
        _check_chain(self.stages, names)
        _check_transforms(self.transforms, names)
        _check_sinks(self.outputs, self.stages)

    @property
    def stages(self) -> tuple[Operator, ...]:
        """The keyed stages in chain order."""
        return self.operator if isinstance(self.operator, tuple) else (self.operator,)

    @property
    def outputs(self) -> tuple[Sink, ...]:
        """The output sinks (without the dead-letter table)."""
        return self.sink if isinstance(self.sink, tuple) else (self.sink,)

    @property
    def source_inputs(self) -> dict[str, Key]:
        """Each source the job reads -> the key of the stage that reads it (a column, or
        several), in chain order."""
        names = {s.name for s in self.sources}
        return {n: k for stage in self.stages for n, k in stage.inputs.items() if n in names}

    def reader_of(self, input_name: str) -> int:
        """The index of the stage that reads source ``input_name``."""
        return next(i for i, s in enumerate(self.stages) if input_name in s.inputs)

    def readers_of(self, stage: int) -> list[int]:
        """The indexes of the later stages that read stage ``stage``'s output."""
        name = self.stages[stage].name
        return [i for i, s in enumerate(self.stages) if i > stage and name in s.inputs]

    def source(self, name: str) -> Source:
        return next(s for s in self.sources if s.name == name)

    def spark_dependencies(self) -> SparkDependencies:
        """What reading the job's sources needs on Spark's classpath, every source's once."""
        needs = [s.spark_dependencies() for s in self.sources]

        def union(part: str) -> tuple[str, ...]:
            return tuple(dict.fromkeys(x for n in needs for x in getattr(n, part)))

        return SparkDependencies(union("packages"), union("excludes"), union("jars"))

    def sinks_of(self, stage: Operator) -> list[Sink]:
        """The sinks that take ``stage``'s output."""
        last = self.stages[-1].name
        return [s for s in self.outputs if (s.stage or last) == stage.name]

    def sinks(self) -> list[Sink]:
        """The output sinks, then the dead-letter table if bad records go to one."""
        if self.bad_records != "dead_letter":
            return list(self.outputs)
        table = self.dead_letter_table or f"{self.name}_dead_letters"
        return [*self.outputs, DeltaSink(DEAD_LETTER_SINK, table)]


def _check_chain(stages: tuple[Operator, ...], sources: list[str]) -> None:
    """The first stage reads sources; each later one reads the stage before it, and may read
    sources and earlier stages besides. A source has one reader; a stage name is not a
    source's."""
    if not stages:
        raise JobDefinitionError("job.operator must name at least one stage")
    for what in ("name", "uid"):
        values = [getattr(s, what) for s in stages]
        if len(set(values)) != len(values):
            raise JobDefinitionError(f"job stages' {what}s must be unique, got {values}")
    clash = sorted({s.name for s in stages} & set(sources))
    if clash:
        raise JobDefinitionError(f"stages and sources must have different names, got {clash}")
    for source in stages[0].inputs:
        if source not in sources:
            raise JobDefinitionError(
                f"stage {stages[0].name!r}: input {source!r} is not one of the job's sources "
                f"{sources}"
            )
    read_by: dict[str, str] = {}
    for i, stage in enumerate(stages):
        earlier = [s.name for s in stages[:i]]
        for name in stage.inputs:
            if name in sources:
                if name in read_by:
                    raise JobDefinitionError(
                        f"source {name!r} is read by stages {read_by[name]!r} and "
                        f"{stage.name!r}: a source has one reader"
                    )
                read_by[name] = stage.name
            elif name not in earlier:
                raise JobDefinitionError(
                    f"stage {stage.name!r}: input {name!r} is neither a source {sources} nor an "
                    f"earlier stage {earlier}"
                )
        if i and stages[i - 1].name not in stage.inputs:
            before = stages[i - 1].name
            raise JobDefinitionError(
                f"stage {stage.name!r} must read the output of the stage before it, "
                f"{before!r}, keyed by its own key (inputs={{{before!r}: <key>, ...}}); "
                f"got inputs {sorted(stage.inputs)}"
            )


def _check_transforms(transforms: tuple[Transform, ...], sources: list[str]) -> None:
    names = [t.name for t in transforms]
    if len(set(names)) != len(names):
        raise JobDefinitionError(f"job.transforms names must be unique, got {names}")
    for t in transforms:
        if t.source not in sources:
            raise JobDefinitionError(
                f"transform {t.name!r}: source {t.source!r} is not one of the job's sources "
                f"{sources}"
            )


def _check_sinks(sinks: tuple[Sink, ...], stages: tuple[Operator, ...]) -> None:
    if not sinks:
        raise JobDefinitionError("job.sink must name at least one sink")
    wrong = [s for s in sinks if not isinstance(s, Sink)]
    if wrong:
        raise JobDefinitionError(
            f"job.sink must be Sinks (DeltaSink, DeltaUpsertSink, ...), got {wrong[0]!r}"
        )
    stage_names = [s.name for s in stages]
    for what in ("name", "target"):
        values = [getattr(s, what) for s in sinks]
        if len(set(values)) != len(values):
            raise JobDefinitionError(f"job sinks' {what}s must be unique, got {values}")
    if any(s.name == DEAD_LETTER_SINK for s in sinks):
        raise JobDefinitionError(f"sink name {DEAD_LETTER_SINK!r} is the dead-letter table's")
    for s in sinks:
        if s.stage is not None and s.stage not in stage_names:
            raise JobDefinitionError(
                f"sink {s.name!r}: stage {s.stage!r} is not one of the job's stages {stage_names}"
            )
