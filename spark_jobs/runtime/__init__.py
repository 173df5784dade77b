"""The driver's runtime: one attempt of a job (run.py), the barrier's return path (barrier.py),
and where epochs ended and the next ones start (epoch_ends.py)."""

from spark_jobs.runtime.run import RunSummary, StreamingRun, run_job

__all__ = ["RunSummary", "StreamingRun", "run_job"]
