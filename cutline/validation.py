"""Definition-time checks shared by jobs, sources and sinks: a bad value raises
:class:`JobDefinitionError` naming the field."""

from __future__ import annotations

import re

from state.errors import BadInputError, NonRetryableError

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class JobDefinitionError(BadInputError, NonRetryableError):
    """A job definition is invalid; the message names the field. Raised in a Spark task too
    (stages that do not fit together), it reaches the driver typed: the job must change."""


def check_name(what: str, name: str) -> str:
    """``name`` if it is lower case, digits and '_', starting with a letter (a job, stage,
    source, sink or table name)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise JobDefinitionError(
            f"{what} must match {_NAME.pattern} (lower case, digits, '_'), got {name!r}"
        )
    return name
