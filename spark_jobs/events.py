"""Progress events of a driver, for whoever launched it.

Under Dagster Pipes (the orchestrator put ``DAGSTER_PIPES_CONTEXT`` in the environment) every
event is a Pipes custom message and every log line is forwarded to Dagster's event log; with
``CUTLINE_EVENTS=stdout`` an event is a ``CUTLINE_EVENT {json}`` line; otherwise events are
dropped. Log lines always go to stdout too. ``dagster_pipes`` is the orchestrator-neutral
protocol package (no Dagster import).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, PipesContext, open_dagster_pipes

from state.redaction import redact

EVENT_LINE = "CUTLINE_EVENT "  # what starts an event's line on stdout (``CUTLINE_EVENTS=stdout``)
_STDOUT = threading.Lock()


def _print_line(line: str) -> None:
    """Write ``line`` to stdout whole: ``print`` writes the text and its newline apart, so lines
    from two threads (a supervisor relaying two drivers) could run together."""
    with _STDOUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class EventChannel:
    """``emit(kind, payload)`` for structured events, ``log(message)`` for text; both redacted
    (state/redaction.py) before they leave the process, each a whole line of stdout even when
    several threads share the channel."""

    def __init__(self, pipes: PipesContext | None = None) -> None:
        self.pipes = pipes
        self.stdout = os.environ.get("CUTLINE_EVENTS") == "stdout"

    def emit(self, kind: str, payload: dict[str, Any]) -> None:
        text = redact(json.dumps({"kind": kind, **payload}, default=str))
        if self.pipes is not None:
            self.pipes.report_custom_message(json.loads(text))
        if self.stdout:
            _print_line(EVENT_LINE + text)

    def log(self, message: str) -> None:
        message = redact(message)
        _print_line(message)
        if self.pipes is not None:
            self.pipes.log.info(message)


@contextmanager
def open_events() -> Iterator[EventChannel]:
    """The channel for this process; under Pipes the session is closed (or the exception
    reported to the orchestrator) on exit."""
    if DAGSTER_PIPES_CONTEXT_ENV_VAR not in os.environ:
        yield EventChannel()
        return
    with open_dagster_pipes() as pipes:
        yield EventChannel(pipes)
