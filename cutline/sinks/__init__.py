"""Sinks: a definition in the job and, per attempt, its writer (base.py); the Delta append sink
(delta.py), the Delta upsert sink (upsert.py), and the staging every two-phase sink's subtasks
write to (staging.py)."""

from cutline.sinks.base import Sink, SinkWriter
from cutline.sinks.delta import DeltaSink
from cutline.sinks.upsert import DeltaUpsertSink

__all__ = ["DeltaSink", "DeltaUpsertSink", "Sink", "SinkWriter"]
