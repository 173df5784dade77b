"""The driver's liveness: a heartbeat in the catalog that orchestrators watch, and the two
reasons a live driver stops itself: a newer attempt of its job has begun (it is superseded), or
the orchestrator process that launched it is gone (so an orphaned driver never runs beside the
restore that replaces it)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from state.catalog import FencedError, JobCatalog
from state.processes import alive

STOP_TIMEOUT_S = 60.0  # how long a stopping driver waits for its heartbeat's call in progress


def heartbeat(
    catalog: JobCatalog,
    job: str,
    attempt: int,
    every_s: float,
    stop: threading.Event,
    fail: Callable[[str, BaseException | None], None],
    log: Callable[[str], None],
    watch_pid: int | None = None,
    upkeep: Callable[[], dict[str, int]] | None = None,
) -> None:
    """Until ``stop``: every ``every_s`` record a heartbeat in ``streaming_jobs`` (an
    orchestrator that sees it stop fails the run); fail the run if attempt ``attempt`` is
    superseded or ``watch_pid`` is gone; after each heartbeat run ``upkeep`` (the catalog's
    and the sinks' upkeep, spark_jobs/catalog/upkeep.py ``driver_upkeep``), which returns the
    files each table's compaction replaced. A missed heartbeat or upkeep is logged, not a
    failure."""
    while not stop.wait(every_s):
        if watch_pid is not None and not alive(watch_pid):
            fail(f"the orchestrator process {watch_pid} is gone", None)
            return
        try:
            catalog.heartbeat(job, attempt)
            newest = catalog.newest_attempt(job)
        except Exception as e:
            log(f"heartbeat: {type(e).__name__}: {e}")
            continue
        if newest > attempt:
            error = FencedError(
                f"attempt {newest} of {job} has started: attempt {attempt} is superseded and stops"
            )
            fail(str(error), error)
            return
        if upkeep is not None:
            try:
                replaced = upkeep()
            except Exception as e:
                log(f"catalog upkeep: {type(e).__name__}: {e}")
                continue
            for table, files in replaced.items():
                log(f"catalog upkeep: {job}'s {files} data files of {table} compacted into one")


class Heartbeat:
    """The driver's :func:`heartbeat` on a thread of its own. :meth:`stop` ends it and waits for
    the catalog call in progress (on slow storage, seconds): a delta-rs call still running on a
    daemon thread while the interpreter exits can crash the process at its very end."""

    def __init__(self, catalog: JobCatalog, job: str, attempt: int, every_s: float, **kw) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=heartbeat,
            args=(catalog, job, attempt, every_s, self._stop),
            kwargs=kw,
            name="cutline-heartbeat",
            daemon=True,
        )

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
