"""Cutline's public API: everything a job in the user's own package needs.

A job is a :class:`JobDefinition`: sources, stateless :class:`Transform` steps of them, one
keyed stage or a chain of them (each later stage re-keys the output of the one before), Delta
sinks taking the stages' outputs, checkpointing. A stage is either a built-in operator
(:class:`KeyedAggregate`, :class:`WindowedAggregate`, :class:`EnrichWithLatest`) or the user's
own logic: a :class:`KeyedProcess` stage running a :class:`KeyedProcessFunction` subclass, whose
keyed states (:class:`ValueStateSpec`, :class:`ListStateSpec`, :class:`MapStateSpec`, optionally
with a :class:`Ttl`) and timers are checkpointed with the sources' positions. Register the job
under the ``cutline.jobs`` entry-point group of your package, or run it as
``cutline run my_package.jobs:attr``.
"""

from spark_jobs.job import (
    DeltaSink,
    EnrichWithLatest,
    JobDefinition,
    JobDefinitionError,
    KafkaSource,
    KeyedAggregate,
    KeyedProcess,
    LogSource,
    Transform,
    WindowedAggregate,
)
from spark_jobs.keyed_process import KeyedContext, KeyedProcessFunction
from state.config import CheckpointConfig
from state.state_types import (
    ListStateSpec,
    MapStateSpec,
    StateAccessError,
    Ttl,
    ValueStateSpec,
)
from state.user_state import ListState, MapState, ValueState

__all__ = [
    "CheckpointConfig",
    "DeltaSink",
    "EnrichWithLatest",
    "JobDefinition",
    "JobDefinitionError",
    "KafkaSource",
    "KeyedAggregate",
    "KeyedContext",
    "KeyedProcess",
    "KeyedProcessFunction",
    "ListState",
    "ListStateSpec",
    "LogSource",
    "MapState",
    "MapStateSpec",
    "StateAccessError",
    "Transform",
    "Ttl",
    "ValueState",
    "ValueStateSpec",
    "WindowedAggregate",
]
