"""Test a stage's :class:`~cutline.KeyedProcessFunction`, or a job's chain of stages, in-process:
no Spark, the runtime's own state code (RocksDB in a temporary directory, the same operator,
snapshot and local-first restore), milliseconds per call (cutline/testing/harness.py).

>>> with Harness(sessions()) as h:
...     h.process([{"user": "a", "url": "/", "ts": 1_000}])
...     out = h.advance_watermark(60_000)   # fires the event-time timers due by then
"""

from cutline.testing.harness import Harness, InjectedFailure
from cutline.testing.records import as_table
from cutline.testing.snapshots import HarnessSnapshot

__all__ = ["Harness", "HarnessSnapshot", "InjectedFailure", "as_table"]
