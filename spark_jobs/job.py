"""Job definitions: sources, keyed operators, sinks, parallelism and checkpointing.

A job is declared once in Python and registered by name, so ``cutline run NAME`` and Dagster find
it. Everything is validated at definition time: a bad value raises :class:`JobDefinitionError`
naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from state.config import CheckpointConfig, ConfigError
from state.keygroups import DEFAULT_MAX_PARALLELISM, KEY_TYPES, check_parallelism

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
AGGREGATES = ("count", "sum", "min", "max")


class JobDefinitionError(ValueError):
    """A job definition is invalid; the message names the field."""


def _check_name(what: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise JobDefinitionError(
            f"{what} must match {_NAME.pattern} (lower case, digits, '_'), got {name!r}"
        )
    return name


@dataclass(frozen=True)
class LogSource:
    """The replayable local log: ``<root>/<topic>/partition-<p>.jsonl``, offsets in bytes.

    ``schema`` is a Spark DDL string of the JSON fields; ``max_records_per_partition`` bounds a
    micro-batch, which makes micro-batch boundaries deterministic for a given input.
    """

    name: str
    topic: str
    schema: str
    max_records_per_partition: int = 10_000

    def __post_init__(self) -> None:
        _check_name("source.name", self.name)
        _check_name("source.topic", self.topic)
        if self.max_records_per_partition < 1:
            raise JobDefinitionError("source.max_records_per_partition must be >= 1")


@dataclass(frozen=True)
class KeyedAggregate:
    """Per key, aggregates of value columns: ``aggregates`` maps an output column to
    ``(function, input column)``, function one of count, sum, min, max (``count`` ignores its
    column). Emits the updated aggregates of every key a micro-batch touched."""

    name: str
    source: str
    key: str
    key_type: str
    aggregates: dict[str, tuple[str, str | None]]

    def __post_init__(self) -> None:
        _check_name("operator.name", self.name)
        if self.key_type not in KEY_TYPES:
            raise JobDefinitionError(f"operator.key_type must be one of {KEY_TYPES}")
        if not self.aggregates:
            raise JobDefinitionError("operator.aggregates must name at least one aggregate")
        for out, (fn, _col) in self.aggregates.items():
            _check_name("operator.aggregates output column", out)
            if fn not in AGGREGATES:
                raise JobDefinitionError(
                    f"operator.aggregates[{out!r}] function must be one of {AGGREGATES}, got {fn!r}"
                )


@dataclass(frozen=True)
class DeltaSink:
    """A Delta table under the warehouse: ``<warehouse>/tables/<table>``."""

    name: str
    table: str

    def __post_init__(self) -> None:
        _check_name("sink.name", self.name)
        _check_name("sink.table", self.table)


@dataclass(frozen=True)
class JobDefinition:
    name: str
    sources: tuple[LogSource, ...]
    operator: KeyedAggregate
    sink: DeltaSink
    checkpoint: CheckpointConfig
    parallelism: int = 2
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    description: str = ""
    tags: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_name("job.name", self.name)
        try:
            check_parallelism(self.parallelism, self.max_parallelism)
        except ValueError as e:
            raise JobDefinitionError(f"job.{e}") from e
        if not self.sources:
            raise JobDefinitionError("job.sources must name at least one source")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise JobDefinitionError(f"job.sources names must be unique, got {names}")
        if self.operator.source not in names:
            raise JobDefinitionError(
                f"operator.source {self.operator.source!r} is not one of the job's sources {names}"
            )

    def source(self, name: str) -> LogSource:
        return next(s for s in self.sources if s.name == name)


_REGISTRY: dict[str, Callable[[], JobDefinition]] = {}


def register_job(factory: Callable[[], JobDefinition]) -> Callable[[], JobDefinition]:
    """Register a job factory under the name of the job it builds (decorator)."""
    try:
        job = factory()
    except ConfigError as e:
        raise JobDefinitionError(str(e)) from e
    _REGISTRY[job.name] = factory
    return factory


def get_job(name: str) -> JobDefinition:
    import spark_jobs.examples  # noqa: F401  (registers the example jobs)

    if name not in _REGISTRY:
        raise JobDefinitionError(f"no job named {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name]()


def job_names() -> list[str]:
    import spark_jobs.examples  # noqa: F401

    return sorted(_REGISTRY)
