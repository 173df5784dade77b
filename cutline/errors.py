"""The error that says a user's own code raised: a stage's function (cutline/keyed_process.py)
or a transform (spark_jobs/sources/frames.py). The message names the stage and carries the
user's traceback; a restore fails the same way until the code is fixed, so ``cutline`` exits 2.
Errors of the runtime under the user's code (a state backend's, ``MemoryError``) are not it."""

from __future__ import annotations

from state.errors import NonRetryableError


class UserCodeError(NonRetryableError):
    """A user's function raised; its message names where and holds the user's traceback."""
