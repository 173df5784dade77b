"""Cutline's public API: everything a job in the user's own package needs.

A job is a :class:`JobDefinition`: sources, stateless :class:`Transform` steps of them, one
keyed stage or a chain of them (each later stage re-keys the output of the one before), sinks
taking the stages' outputs (:class:`DeltaSink` appends, :class:`DeltaUpsertSink` keeps the
latest row per key; a new kind subclasses :class:`Sink`), checkpointing. Every stage is a
:class:`KeyedProcess` running a :class:`KeyedProcessFunction`: the user's own, or one of the
library's, built by :func:`KeyedAggregate`, :func:`WindowedAggregate` and
:func:`EnrichWithLatest` on this API alone. A function's keyed states (:class:`ValueStateSpec`,
:class:`ListStateSpec`, :class:`MapStateSpec`, optionally with a :class:`Ttl`) and timers are
checkpointed with the sources' positions. Register the job under the ``cutline.jobs``
entry-point group of your package, or run it as ``cutline run my_package.jobs:attr``.

Each name is imported from its module when first used: a process that needs one module of the
package (the Python data source planners Spark starts for every query unpickle a source's reader)
does not import all of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cutline._lazy import lazy_exports

if TYPE_CHECKING:
    from cutline.job import JobDefinition, JobDefinitionError, KeyedProcess, Transform
    from cutline.keyed_process import SOURCE_COLUMN, KeyedContext, KeyedProcessFunction
    from cutline.operators import EnrichWithLatest, KeyedAggregate, WindowedAggregate
    from cutline.sinks import DeltaSink, DeltaUpsertSink, Sink, SinkWriter
    from cutline.sources import FileSource, KafkaSource, LogSource, Source
    from state.config import CheckpointConfig
    from state.state_types import ListStateSpec, MapStateSpec, StateAccessError, Ttl, ValueStateSpec
    from state.user_state import ListState, MapState, ValueState

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "cutline.job": ("JobDefinition", "JobDefinitionError", "KeyedProcess", "Transform"),
        "cutline.keyed_process": ("SOURCE_COLUMN", "KeyedContext", "KeyedProcessFunction"),
        "cutline.operators": ("EnrichWithLatest", "KeyedAggregate", "WindowedAggregate"),
        "cutline.sinks": ("DeltaSink", "DeltaUpsertSink", "Sink", "SinkWriter"),
        "cutline.sources": ("FileSource", "KafkaSource", "LogSource", "Source"),
        "state.config": ("CheckpointConfig",),
        "state.state_types": (
            "ListStateSpec",
            "MapStateSpec",
            "StateAccessError",
            "Ttl",
            "ValueStateSpec",
        ),
        "state.user_state": ("ListState", "MapState", "ValueState"),
    },
)

__all__ = [
    "SOURCE_COLUMN",
    "CheckpointConfig",
    "DeltaSink",
    "DeltaUpsertSink",
    "EnrichWithLatest",
    "FileSource",
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
    "Sink",
    "SinkWriter",
    "Source",
    "StateAccessError",
    "Transform",
    "Ttl",
    "ValueState",
    "ValueStateSpec",
    "WindowedAggregate",
]
