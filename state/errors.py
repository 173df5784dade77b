"""The one error class every layer raises for input or configuration that is wrong.

A :class:`BadInputError` says that running the same thing again fails the same way: a bad
option value, a storage URL or bucket name that cannot be, a job definition or state access the
runtime refuses, a file of Cutline's (manifest, ack, request) that does not parse. ``cutline``
exits 2 for it (spark_jobs/errors.py), so an orchestrator does not restart into it. Any other
``ValueError`` — ``pyarrow.ArrowInvalid`` or ``json.JSONDecodeError`` from a read that raced a
writer, an invariant broken by a bug — is not classified by its type, and a restore may fix it.
"""

from __future__ import annotations


class BadInputError(ValueError):
    """The input or the configuration is wrong: a retry as it is fails the same way."""
