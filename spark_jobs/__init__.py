"""Cutline's runtime on Spark, grouped by where each part runs: ``driver/`` (one attempt's
driver), ``executor/`` (what runs inside Spark tasks), ``sources/``, ``sinks/``, ``catalog/``,
``maintenance/`` (GC, compaction), ``commands/`` (the ``cutline`` command) and ``deploy/`` (the
Spark session, settings, the cluster harness). The public API is the ``cutline`` package."""
