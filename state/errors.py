"""What a restore cannot fix: the base classes of the errors for which ``cutline`` exits 2
(spark_jobs/errors.py), here so that every layer can raise them.

:class:`NonRetryableError` is any failure a restore would meet again (a user's function that
raises, a checkpoint the job cannot take). :class:`BadInputError` is the ``ValueError`` kind:
input or configuration found wrong.

A :class:`BadInputError` says that running the same thing again fails the same way: a bad
option value, a storage URL or bucket name that cannot be, a job definition or state access the
runtime refuses, a file of Cutline's (manifest, ack, request) that does not parse. ``cutline``
exits 2 for it (spark_jobs/errors.py), so an orchestrator does not restart into it. Any other
``ValueError`` — ``pyarrow.ArrowInvalid`` or ``json.JSONDecodeError`` from a read that raced a
writer, an invariant broken by a bug — is not classified by its type, and a restore may fix it.
"""

from __future__ import annotations


class NonRetryableError(Exception):
    """A failure that a restore cannot fix (exit 2)."""


class BadInputError(ValueError):
    """The input or the configuration is wrong: a retry as it is fails the same way."""
