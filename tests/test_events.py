"""A driver's event channel (spark_jobs/events.py): what a supervisor relaying two drivers, one
thread each, writes stays one event or log line per line of its output."""

from __future__ import annotations

import json
import threading

from spark_jobs.events import EVENT_LINE, EventChannel


def test_events_and_log_lines_from_two_threads_never_run_together(capsys, monkeypatch):
    monkeypatch.setenv("CUTLINE_EVENTS", "stdout")
    channel, count = EventChannel(), 3_000

    def relay(driver: int) -> None:
        for batch in range(count):
            channel.emit("batch", {"driver": driver, "epoch": batch})
            channel.log(f"checkpoint {batch} complete: driver {driver}")

    threads = [threading.Thread(target=relay, args=(driver,)) for driver in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = capsys.readouterr().out.splitlines()
    events = [json.loads(line[len(EVENT_LINE) :]) for line in lines if line.startswith(EVENT_LINE)]
    logs = [line for line in lines if not line.startswith(EVENT_LINE)]
    assert all(line.startswith("checkpoint ") for line in logs), next(
        line for line in logs if not line.startswith("checkpoint ")
    )
    for driver in (1, 2):
        assert [e["epoch"] for e in events if e["driver"] == driver] == list(range(count))
    assert len(logs) == 2 * count
