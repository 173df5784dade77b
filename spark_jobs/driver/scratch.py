"""The driver's scratch directory for Spark's own query checkpoint, which Cutline never reads
(its checkpoints are its own): created per attempt in the temp directory, named by the driver's
pid, and removed when the attempt ends. A driver killed with SIGKILL cannot remove its own, so
every start removes those of the same job whose driver is gone."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from state.processes import alive


def query_scratch(job_name: str) -> str:
    """A new directory for this attempt's query checkpoint, named by this process's pid; first
    removes the directories of ``job_name`` left by drivers no longer alive."""
    prefix = f"cutline-{job_name}-query-"
    for left in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        owner = left.name[len(prefix) :].split("-", 1)[0]
        if owner.isdigit() and not alive(int(owner)):
            shutil.rmtree(left, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
