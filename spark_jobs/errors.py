"""Why a run stops, as exception types, and the exit code of ``cutline`` for each.

The exit code tells an orchestrator what to do: ``1`` the run failed and a restore from the
latest checkpoint may fix it; ``2`` the input or the configuration is wrong and a restore would
fail the same way (bad record, wrong root, nothing restorable, a user function that raises,
a checkpoint whose state the job cannot take); ``3`` a newer attempt of the job
has started, so this one must not be replaced by yet another.
"""

from __future__ import annotations

from state.catalog import FencedError

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_SUPERSEDED = 3


class NonRetryableError(Exception):
    """A failure that a restore cannot fix (exit 2)."""


class ConfigurationError(NonRetryableError):
    """A setting is wrong: a bad option value, a root that holds none of the job's files, a
    start-over that would append to a sink with output."""


class NoRestorableCheckpointError(NonRetryableError):
    """The job has made progress (checkpoints in the catalog, output in its sink) but nothing
    can be restored: the run refuses to start over silently."""


class BadRecordError(NonRetryableError):
    """A record of a source cannot be processed and the job's policy is to fail."""


class UserCodeError(NonRetryableError):
    """A user's stage function raised (spark_jobs/keyed_process.py): the message names the stage
    and carries the user's traceback; a restore fails the same way until the code is fixed."""


class IncompatibleStateError(NonRetryableError):
    """The checkpoint to restore holds state the job cannot take: a stage uid the job lacks, or
    a state whose stored form changed (spark_jobs/evolution.py)."""


class AttemptFailedError(RuntimeError):
    """The attempt failed; a restore from the latest checkpoint may fix it (exit 1)."""


def exit_code(error: BaseException) -> int:
    """The exit code of ``cutline`` for a run that raised ``error``."""
    if isinstance(error, FencedError):
        return EXIT_SUPERSEDED
    if isinstance(error, NonRetryableError | ValueError):
        return EXIT_BAD_INPUT
    return EXIT_FAILED
