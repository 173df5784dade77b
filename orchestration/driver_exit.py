"""A driver's exit as its user reads it: the exit code with the signal that ended the process
named, and the catalog's attempt row of a driver that died without saying why.

A driver ended by a signal (a crash in native code, the kernel's OOM killer, ``kill -9``) writes
nothing itself. ``spark-submit`` reports its Python driver's death as exit code 128 + the signal
(Java's convention); a process killed directly has a negative return code. Either way the
Dagster run's failure and the attempt's ``failure_reason`` name the signal, and the run closes
the driver's Dagster Pipes session on its behalf with that cause, where Dagster would otherwise
warn that the external code did not use ``open_dagster_pipes`` as a context manager (it does:
it was killed before it could close it).
"""

from __future__ import annotations

import json
import signal

from state.catalog import JobCatalog

_SIGNALLED = 128  # a child's exit code above this is 128 + the signal that ended it


def signal_of(code: int) -> int | None:
    """The signal that ended a process with return code ``code`` (negative: Python's
    ``subprocess``; 129 to 192: a shell's or Java's 128 + n), or None."""
    number = -code if code < 0 else code - _SIGNALLED if code > _SIGNALLED else 0
    return number if 0 < number <= 64 else None


def exit_description(code: int) -> str:
    """``code`` in words: ``exit code 1``, ``killed by signal 11 (SIGSEGV)``, or ``exit code
    139: killed by signal 11 (SIGSEGV)``."""
    number = signal_of(code)
    if number is None:
        return f"exit code {code}"
    try:
        name = f" ({signal.Signals(number).name})"
    except ValueError:
        name = ""
    killed = f"killed by signal {number}{name}"
    return killed if code < 0 else f"exit code {code}: {killed}"


def record_driver_exit(catalog: JobCatalog, job_id: str, run_id: str, code: int) -> list[int]:
    """Mark the attempts of run ``run_id`` still RUNNING after its driver exited with ``code``
    (non-zero) FAILED, with the exit in ``failure_reason``: a driver that records its own end
    leaves none RUNNING. Returns the attempts marked."""
    left = [
        r["attempt"]
        for r in catalog.jobs(job_id)
        if r["run_id"] == run_id and r["status"] == "RUNNING"
    ]
    reason = f"the driver process ended ({exit_description(code)}) without recording why"
    for attempt in left:
        catalog.set_job_status(job_id, attempt, "FAILED", reason)
    return left


def close_pipes_for_signalled(message_file: str, code: int) -> bool:
    """Append to a driver's Pipes message file the ``closed`` message its process could not
    write, carrying its death by a signal as the cause; False (nothing written) unless a
    signal ended it. Read in order after whatever the driver wrote before it died."""
    from dagster_pipes import PIPES_PROTOCOL_VERSION, PIPES_PROTOCOL_VERSION_FIELD

    if signal_of(code) is None:
        return False
    cause = {
        "name": "DriverKilled",
        "message": f"the driver process was {exit_description(code).split(': ')[-1]} before "
        "it could close its Pipes session (it closes it itself on any other end)",
        "stack": [],
        "cause": None,
        "context": None,
    }
    closed = {
        PIPES_PROTOCOL_VERSION_FIELD: PIPES_PROTOCOL_VERSION,
        "method": "closed",
        "params": {"exception": cause},
    }
    with open(message_file, "a", encoding="utf-8") as out:
        out.write(json.dumps(closed) + "\n")
    return True
