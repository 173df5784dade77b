"""Cold restart at the peer benchmark's state size: from a new driver process's start to its
first completed micro-batch, and what the driver JVM's options cost the steady micro-batches.

The peer benchmark's job and input (bench/peer_bench.py: ``user_activity``, 150 bytes per key,
every key once then as many uniform updates, 100,000 records per partition and micro-batch,
``local[2]``) run once to build the state; then each variant restores it ``--repeat`` times with
``cutline run --max-batches N`` after N micro-batches of input were appended, in turn, so that
the variants share the machine's drift. Per run: the process start to the first micro-batch, the
driver's phases (its ``startup`` event) and the median of its later micro-batches' intervals.

    .venv/bin/python bench/cold_restart_bench.py --repeat 3

Prints each run and the medians; writes bench/results/cold_restart.json. With ``--after-kill S``
the state is instead left by a driver killed with ``kill -9`` after S seconds of the peer
benchmark's sustained input (20,000 records/s), as the peer benchmark's restart finds it, and
every run restarts the shipped driver from a copy of that same state
(bench/results/cold_restart_after_kill.json). With ``--checkouts A B ...`` as well (git
worktrees of the commits compared), the restarts alternate between those checkouts' drivers,
all from the one killed state, so that a change's effect is not the machine's drift:

    git worktree add /tmp/before HEAD~1
    .venv/bin/python bench/cold_restart_bench.py --after-kill 90 --checkouts /tmp/before .
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from peer_bench import start_driver, wait_until  # noqa: E402
from peer_input import FORMATS, Appender, build_input, log_writer  # noqa: E402
from peer_spark import LATE_C2  # noqa: E402

from spark_jobs.deploy.session import DRIVER_JAVA_OPTIONS as JAVA  # noqa: E402

BATCH = 100_000  # records per partition and micro-batch, the peer benchmark's
# name -> extra arguments of ``cutline run`` (the driver's JVM options after Cutline's C1 alone:
# of two conflicting options the last wins)
VARIANTS: dict[str, list[str]] = {
    "as shipped (C1 only)": [],
    "C2 for methods 10x hotter": ["--conf", f"{JAVA}={LATE_C2}"],
    "the JVM's default JIT": ["--conf", f"{JAVA}=-XX:TieredStopAtLevel=4"],
}


def build_state(home: Path, mib: int, fmt: str) -> tuple[int, int]:
    """The peer benchmark's input for ``mib`` MiB of state (its log in ``fmt``), read once to its
    end by a driver killed after that; returns the keys and the next event time."""
    keys = mib * 2**20 // 150
    backlog, ts = build_input(home / "log", keys, 1.0, seed=mib, fmt=fmt)
    driver = start_driver("cutline", home, BATCH)
    if not wait_until(lambda: driver.records() >= backlog, time.monotonic() + 1800, driver, "it"):
        raise RuntimeError("the state was not built in 30 minutes")
    time.sleep(4)  # a checkpoint after the last micro-batch
    driver.kill()
    return keys, ts


def kill_mid_stream(home: Path, keys: int, ts: int, seconds: float) -> int:
    """A driver on ``home`` reading the peer benchmark's sustained input for ``seconds``, then
    ``kill -9``; returns the next event time."""
    appender = Appender(log_writer(home / "log"), keys, 20_000, ts, seed=11)
    driver = start_driver("cutline", home, BATCH)
    appender.start()
    time.sleep(seconds)
    driver.kill()
    appender.stopped.set()
    appender.join()
    return appender.ts


def after_kill(home: Path, args: argparse.Namespace) -> list[dict]:
    """``--repeat`` restarts (of each checkout in turn), each from a copy of one state a killed
    driver left."""
    keys, ts = build_state(home, args.mib, args.log_format)
    ts = kill_mid_stream(home, keys, ts, args.after_kill)
    killed = home.with_name(home.name + "-killed")
    shutil.copytree(home, killed, symlinks=True)  # the local copies' hard links become files
    runs = []
    for i in range(args.repeat):
        for root in args.checkouts:
            shutil.rmtree(home)
            shutil.copytree(killed, home, symlinks=True)  # the same path: the roots are checked
            appender = Appender(log_writer(home / "log"), keys, 1, ts, seed=3)
            run = {"commit": commit_of(root), **restart(home, appender, args.batches, [], root)}
            runs.append(run)
            print(f"after kill {i + 1}: {json.dumps(run)}", flush=True)
    return runs


def commit_of(root: Path) -> str:
    """The commit checked out at ``root``, with ``+`` when it has changes not committed."""

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout

    dirty = "+" if git("status", "--porcelain", "--untracked-files=no").strip() else ""
    return git("rev-parse", "--short", "HEAD").strip() + dirty


def restart(
    home: Path, appender: Appender, batches: int, more: list[str], root: Path = ROOT
) -> dict:
    appender.append(BATCH * 2 * batches)
    driver = start_driver("cutline", home, BATCH, "--max-batches", str(batches), *more, root=root)
    code = driver.proc.wait(timeout=600)
    time.sleep(0.5)  # the reader thread's last lines
    if code != 0 or len(driver.batches) < batches:
        raise RuntimeError(f"the restart exited {code} after {len(driver.batches)} micro-batches")
    ends = [b.end for b in driver.batches]
    later = [b - a for a, b in itertools.pairwise(ends[1:])]  # from the second one's end
    return {
        "to_first_batch_s": round(ends[0] - driver.started, 2),
        "steady_batch_s": round(statistics.median(later), 2),
        "phases_s": driver.startup,
    }


def add_checkouts(parser: argparse.ArgumentParser, runs: str) -> None:
    """``--checkouts``: git worktrees of the commits compared, whose drivers take turns."""
    parser.add_argument(
        "--checkouts",
        type=lambda p: Path(p).resolve(),
        nargs="+",
        default=[ROOT],
        help=f"{runs} these checkouts' drivers in turn (default: this one)",
    )


def after_kill_result(args: argparse.Namespace) -> dict:
    """``--after-kill``: the restarts from one killed driver's state."""
    with tempfile.TemporaryDirectory(prefix="cutline-cold-restart-") as tmp:
        runs = after_kill((args.work or Path(tmp)) / "home", args)
    first = statistics.median(r["to_first_batch_s"] for r in runs)
    print(f"after a kill: first micro-batch {first} s after the process start (median)")
    by_commit = {
        c: statistics.median(r["to_first_batch_s"] for r in runs if r["commit"] == c)
        for c in dict.fromkeys(r["commit"] for r in runs)
    }
    if len(by_commit) > 1:
        print(f"medians by commit: {by_commit}")
    return {
        "what": f"cold restart of the peer benchmark's job at {args.mib} MiB of state from what "
        f"a driver killed after {args.after_kill:.0f} s of sustained input left: process start "
        f"to the first micro-batch ({BATCH:,} records per partition, local[2])",
        "runs": runs,
        "median_to_first_batch_s": first,
        "median_by_commit": by_commit,
    }


def variants_result(args: argparse.Namespace) -> dict:
    """The JIT variants in turn, each restarted ``--repeat`` times on one cleanly stopped state."""
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="cutline-cold-restart-") as tmp:
        home = Path(tmp)
        keys, ts = build_state(home, args.mib, args.log_format)
        appender = Appender(log_writer(home / "log"), keys, 1, ts, seed=3)
        for i in range(args.repeat):
            for name, more in VARIANTS.items():
                run = restart(home, appender, args.batches, more)
                runs[name].append(run)
                print(f"{name} {i + 1}: {json.dumps(run)}", flush=True)
    medians = {
        name: {
            "to_first_batch_s": statistics.median(r["to_first_batch_s"] for r in rs),
            "steady_batch_s": statistics.median(r["steady_batch_s"] for r in rs),
        }
        for name, rs in runs.items()
    }
    for name, m in medians.items():
        print(f"{name}: first micro-batch {m['to_first_batch_s']} s after the process start, "
              f"steady micro-batch {m['steady_batch_s']} s (medians)")  # fmt: skip
    return {
        "what": f"cold restart of the peer benchmark's job at {args.mib} MiB of state: process "
        f"start to the first micro-batch, and the later micro-batches' median interval "
        f"({BATCH:,} records per partition, local[2])",
        "runs": runs,
        "medians": medians,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default="arrow",
        help="the input log's (jsonl for a checkout from before Arrow segments)",
    )
    parser.add_argument("--batches", type=int, default=8, help="micro-batches per restart")
    parser.add_argument("--after-kill", type=float, metavar="S", help="see the module's doc")
    parser.add_argument("--work", type=Path, help="--after-kill: keep the state here")
    add_checkouts(parser, "--after-kill: restart with")
    parser.add_argument("--out", help="default: bench/results/cold_restart[_after_kill].json")
    args = parser.parse_args()
    name = "cold_restart_after_kill" if args.after_kill else "cold_restart"
    result = after_kill_result(args) if args.after_kill else variants_result(args)
    result["measured"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = Path(args.out or ROOT / "bench" / "results" / f"{name}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
