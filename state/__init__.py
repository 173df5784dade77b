"""Cutline's engine-agnostic checkpoint core: keyed state, snapshots, storage, restore, coordinator.

Imports neither Spark nor Dagster; ``spark_jobs`` and ``orchestration`` build on it.
"""
