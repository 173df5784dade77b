"""Failover: from ``kill -9`` of a running driver (its process group: the JVM and Python workers
too) to the first micro-batch of the attempt that replaces it, a cold restart against a standby's
takeover (spark_jobs/driver/standby.py), in one invocation on one input.

- cold: a new ``cutline run`` started the moment the killed one is gone, as an orchestrator
  without backoff would start it; it pays for the JVM, the Spark session and cold workers;
- standby: ``cutline run --standby``; the supervisor sees the active driver's exit and orders the
  warm standby to take over. Each kill waits until the next standby is warm again.

``clicks_per_user`` over the local log, parallelism 2, checkpoints every second, each run killed
``--repeat`` times at 2 s after its attempt's first micro-batch. The first micro-batch is its
``batch`` event as the bench reads it from the driver's output (polled every 20 ms).

    .venv/bin/python bench/failover_bench.py --repeat 3

Prints each failover and the medians; writes bench/results/failover.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spark_jobs.events import EVENT_LINE as EVENT  # noqa: E402
from spark_jobs.sources.generate import generate  # noqa: E402

JOB = "clicks_per_user"
RUN = ["run", JOB, "--interval-ms", "1000", "--max-records-per-partition", "2000"]
POLL_S = 0.02


class Run:
    """One ``cutline`` process writing its output to a file, read as it grows."""

    def __init__(self, home: Path, name: str, *args: str) -> None:
        self.log = home / f"{name}.log"
        command = [sys.executable, "-m", "spark_jobs.commands", "--home", str(home), *args]
        env = {**os.environ, "CUTLINE_EVENTS": "stdout"}
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        self.read = 0  # lines already looked at

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def next_line(self, wanted, timeout_s: float = 300.0) -> str:
        """Wait for the next line (after those already seen) for which ``wanted`` holds."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = self.lines()
            for index in range(self.read, len(lines)):
                if wanted(lines[index]):
                    self.read = index + 1
                    return lines[index]
            self.read = max(self.read, len(lines) - 1)
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.log} ended (exit {self.process.returncode})")
            time.sleep(POLL_S)
        raise TimeoutError(f"{self.log}: no such line in {timeout_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


def event(line: str, kind: str) -> dict | None:
    if not line.startswith(EVENT):
        return None
    body = json.loads(line[len(EVENT) :])
    return body if body.get("kind") == kind else None


def kill_group(pid: int) -> float:
    """SIGKILL of ``pid``'s process group; the moment it was sent."""
    at = time.monotonic()
    os.killpg(pid, signal.SIGKILL)
    return at


def startup_phases(run: Run) -> dict[str, float]:
    """The phases of the start whose first micro-batch was just read (its ``startup`` event,
    which follows that micro-batch's ``batch`` event)."""
    found = event(run.next_line(lambda line: event(line, "startup") is not None), "startup")
    assert found is not None
    found.pop("kind")
    return found


def cold(home: Path, repeat: int, phases: list[dict]) -> list[float]:
    seconds = []
    run = Run(home, "cold-0", *RUN)
    for i in range(repeat):
        run.next_line(lambda line: event(line, "batch") is not None)
        time.sleep(2.0)
        killed = kill_group(run.process.pid)
        run.process.wait()
        run = Run(home, f"cold-{i + 1}", *RUN)
        run.next_line(lambda line: event(line, "batch") is not None)
        seconds.append(time.monotonic() - killed)
        phases.append(startup_phases(run))
        print(f"cold restart {i + 1}: {seconds[-1]:.2f} s from the kill to a micro-batch "
              f"({phases[-1]})", flush=True)  # fmt: skip
    run.stop()
    return seconds


def standby(home: Path, repeat: int, phases: list[dict]) -> list[float]:
    seconds = []
    run = Run(home, "standby", *RUN, "--standby")
    drivers = {"active": None}  # the supervisor's latest word on who is active

    def seen(wanted):
        def check(line: str) -> bool:
            announced = event(line, "drivers")
            if announced:
                drivers.update(announced)
            return wanted(line)

        return check

    for i in range(repeat):
        run.next_line(seen(lambda line: "warm, waiting" in line))  # a standby is ready
        run.next_line(seen(lambda line: event(line, "batch") is not None))  # the active runs
        time.sleep(2.0)
        killed = kill_group(drivers["active"])
        run.next_line(seen(lambda line: event(line, "takeover") is not None))
        run.next_line(seen(lambda line: event(line, "batch") is not None))
        seconds.append(time.monotonic() - killed)
        phases.append(startup_phases(run))
        print(f"standby takeover {i + 1}: {seconds[-1]:.2f} s from the kill to a micro-batch "
              f"({phases[-1]})", flush=True)  # fmt: skip
    run.stop()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--records", type=int, default=300_000, help="per partition")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "failover.json"))
    args = parser.parse_args()
    results, phases = {}, {}
    with tempfile.TemporaryDirectory(prefix="cutline-failover-") as scratch:
        for name, measure in (("cold", cold), ("standby", standby)):
            home = Path(scratch) / name
            generate(home / "log", "clicks", "clicks", count=args.records, seed=7, users=50_000)
            phases[name] = []
            results[name] = [round(s, 2) for s in measure(home, args.repeat, phases[name])]
    summary = {name: statistics.median(s) for name, s in results.items()}
    print(", ".join(f"{name}: median {s:.2f} s" for name, s in summary.items()))
    Path(args.out).write_text(json.dumps({
        "what": "kill -9 of the driver to the replacing attempt's first micro-batch: "
                f"{JOB}, parallelism 2, local log, local Spark",
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": results,
        "median_s": summary,
        "startup_phases_s": phases,  # each restart's own timeline (seconds per phase)
    }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
