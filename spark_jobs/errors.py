"""Why a run stops, as exception types, and the exit code of ``cutline`` for each.

The exit code tells an orchestrator what to do: ``1`` the run failed and a restore from the
latest checkpoint may fix it; ``2`` the input or the configuration is wrong and a restore would
fail the same way (bad record, wrong root, nothing restorable, a user function that raises,
a checkpoint whose state the job cannot take: a :class:`NonRetryableError`, or a
:class:`~state.errors.BadInputError` from the layers below); ``3`` a newer attempt of the job
has started, so this one must not be replaced by yet another. Any other error is ``1``, a
``ValueError`` too: ``pyarrow.ArrowInvalid`` and ``json.JSONDecodeError`` are ValueErrors, and a
read that raced a writer is worth a retry. Inside a running attempt only a
:class:`NonRetryableError` (and a fence) keeps its code: a ``BadInputError`` met there (a
manifest or handle found malformed mid-run) fails the attempt (exit 1), and the next start
judges those files with evidence, marking a checkpoint CORRUPT and falling back if it must.

A :class:`NonRetryableError` raised inside a Spark task (a user function that raises, a
checkpoint whose state does not cover a subtask's key groups) reaches the driver only as text
in Spark's report of the failed task. The task's body runs in :func:`carry_to_driver`, which
raises a :class:`TaskError` whose text holds the error's class and message between markers; the
driver finds them in the failure's text (:func:`task_error`) and raises the typed error with the
clean message, so it exits 2 like the same error raised on the driver.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from state.catalog import FencedError
from state.errors import BadInputError, NonRetryableError
from state.redaction import redact

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_SUPERSEDED = 3


class ConfigurationError(NonRetryableError):
    """A setting is wrong: a bad option value, a root that holds none of the job's files, a
    start-over that would append to a sink with output."""


class NoRestorableCheckpointError(NonRetryableError):
    """The job has made progress (checkpoints in the catalog, output in its sink) but nothing
    can be restored: the run refuses to start over silently."""


class BadRecordError(NonRetryableError):
    """A record of a source cannot be processed and the job's policy is to fail."""


class IncompatibleStateError(NonRetryableError):
    """The checkpoint to restore holds state the job cannot take: a stage uid the job lacks, or
    a state whose stored form changed (spark_jobs/driver/evolution.py)."""


class AttemptFailedError(RuntimeError):
    """The attempt failed; a restore from the latest checkpoint may fix it (exit 1)."""


def exit_code(error: BaseException) -> int:
    """The exit code of ``cutline`` for a run that raised ``error``."""
    if isinstance(error, FencedError):
        return EXIT_SUPERSEDED
    if isinstance(error, NonRetryableError | BadInputError):
        return EXIT_BAD_INPUT
    return EXIT_FAILED


TASK_ERROR_MARKER = "cutline-non-retryable"
_MARKED = re.compile(
    rf"\[\[{TASK_ERROR_MARKER} (\w+)\]\](.*?)\[\[/{TASK_ERROR_MARKER}\]\]", re.DOTALL
)
MAX_MESSAGE = 8000  # a user's traceback can be long; the log keeps all of it


class TaskError(RuntimeError):
    """What a Spark task raises for a :class:`NonRetryableError`: its text is
    :func:`mark_task_error`'s, which survives Spark's wrapping of the task's failure."""


def mark_task_error(error: NonRetryableError) -> str:
    """``error``'s class name and message between markers, for :func:`task_error` to find."""
    return f"[[{TASK_ERROR_MARKER} {type(error).__name__}]]{error}[[/{TASK_ERROR_MARKER}]]"


def _non_retryable_classes() -> dict[str, type[NonRetryableError]]:
    found, todo = {}, [NonRetryableError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return found


def task_error(failure: str) -> NonRetryableError | None:
    """The first error :func:`mark_task_error` marked in ``failure`` (a failed Spark job's text,
    however Spark wrapped it), as its own class with its clean message; a class this process
    does not know comes back as :class:`NonRetryableError`. ``None`` when nothing is marked."""
    match = _MARKED.search(failure)
    if match is None:
        return None
    name, message = match.group(1), match.group(2).strip()[:MAX_MESSAGE]
    cls = _non_retryable_classes().get(name, NonRetryableError)
    try:
        return cls(message)
    except TypeError:  # a subclass that takes other arguments
        return NonRetryableError(message)


@contextmanager
def carry_to_driver() -> Iterator[None]:
    """Around the body of a Spark task: a :class:`NonRetryableError` leaves it as a
    :class:`TaskError` that the driver turns back into the typed error (:func:`task_error`).
    Other errors pass unchanged: the driver treats them as retryable."""
    try:
        yield
    except NonRetryableError as e:
        raise TaskError(mark_task_error(e)) from e


_NOISE = (  # where Spark's and py4j's wrapping of a failure starts, on its first line
    "[STREAM_FAILED]",
    "An exception was raised by the Python Proxy",
    "Traceback (most recent call last)",
    "org.apache.spark.",
    "Job aborted due to stage failure",
    "py4j.protocol.",
)
_TASK = re.compile(r"Lost task ([\d.]+) in stage ([\d.]+)")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.MULTILINE)
_EXCEPTION = re.compile(r"^(?:Caused by: )?(?:[A-Za-z_][\w.$]*)?(?:Error|Exception|Exit)\w*(?::|$)")
_TRACE_END = re.compile(r"\n(?:\tat |Driver stacktrace|=== Streaming Query ===)")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+\s*$")
# a full disk as Python says it, or as RocksDB does
_DISK_FULL = re.compile(
    r"\[Errno 28\] No space left on device(?:: '([^']*)')?"
    r"|No space left on device(?:: While \w+ (?:to )?file: (\S+?):)?"
)


def failure_summary(text: str, limit: int = 1000) -> str:
    """One line a person reads for a failure's text, secrets masked (state/redaction.py): see
    :func:`_summary`."""
    return redact(_summary(text, limit))


def _summary(text: str, limit: int) -> str:
    """The line for a failure's text (``failure_reason`` in the catalog, the
    driver's last line): a clean first line (a bad record, a user function that raised) as it
    is; a py4j or Spark trace as what failed, the task and stage, the exception and where the
    innermost Python frame raised it; a full disk as the path that could not be written."""
    lines = text.strip().splitlines()
    first = lines[0] if lines else ""
    cut = min((i for i in (first.find(m) for m in _NOISE) if i >= 0), default=-1)
    if cut < 0:
        return first[:limit]
    head = first[:cut].rstrip(" :") or "failed"
    task = _TASK.search(text)
    if task:
        head += f" (task {task.group(1)} in stage {task.group(2)})"
    trace_at = text.rfind("Traceback (most recent call last)")
    if trace_at >= 0:  # Python's: its last exception line, before the Java frames
        trace = text[trace_at:]
        trace = trace[: m.start()] if (m := _TRACE_END.search(trace)) else trace
        found = [ln for ln in trace.splitlines() if _EXCEPTION.match(ln)][-1:]
    else:  # the JVM's: its root cause
        trace = ""
        found = [ln for ln in lines if ln.startswith("Caused by: ")][-1:]
    error = _SQLSTATE.sub("", found[0].removeprefix("Caused by: ")) if found else first[cut:]
    if "disk full" not in error and (full := _DISK_FULL.search(text)):  # said plainly
        path = full[1] or full[2]
        error = "disk full: no space left on device" + (f" writing {path}" if path else "")
    where = ""
    if frames := _FRAME.findall(trace):
        path, line, function = frames[-1]
        where = f" (at {'/'.join(path.split('/')[-2:])}:{line} in {function})"
    return f"{head}: {error}{where}"[:limit]
