"""Takeover at the peer benchmark's state size: from ``kill -9`` of the active driver to the
standby's first completed micro-batch, its phases, and the micro-batches after it; repeated on
one state, so that one invocation gives a spread instead of the single takeover of
bench/peer_bench.py.

The peer benchmark's job and input (``user_activity``, 150 bytes per key, every key once then as
many uniform updates, 100,000 records per partition and micro-batch, ``local[2]``) run once to
build the state, then ``--sustain`` seconds of its sustained input (20,000 records/s) end in
``kill -9``. Every trial starts from that one killed state: ``cutline run --standby`` on a copy of
it; once its standby is warm, ``kill -9`` of the active driver's process group and one
micro-batch of new records (the peer benchmark's takeover), then ``--after`` more micro-batches
of new records, one at a time (a takeover that leaves the state path slower shows there). The
copy hard-links the SST files, which nothing rewrites, so the page cache and the identities the
local copies recorded (state/local_copies.py) are the killed driver's, as in a takeover; every
other file is copied. ``--evict`` drops the copy's SST files from the page cache before each
trial, so that every trial starts as a state idle for minutes would, whatever the one before
read. ``--idle S ...``: how long the warm standby (and the active driver, given no input) waits
before the kill, 2 s as in the peer benchmark; several values, the trials take them in turn (a
standby idle for minutes: the kernel may have paged out what it loaded). With
``--checkouts A B ...`` (git worktrees of the commits compared) the
trials alternate between those checkouts' drivers, so that a change's effect is not the
machine's drift.

    .venv/bin/python bench/takeover_bench.py --mib 1024 --repeat 3

Prints each takeover and the medians; writes bench/results/takeover.json.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cold_restart_bench import (  # noqa: E402
    BATCH,
    add_checkouts,
    build_state,
    commit_of,
    kill_mid_stream,
)
from peer_bench import start_driver, takeover, wait_until  # noqa: E402
from peer_input import FORMATS, PARTITIONS, Appender, log_writer  # noqa: E402

from state.page_cache import drop  # noqa: E402


def link_or_copy(source: str, target: str) -> None:
    """SST files hard-linked (immutable), every other file copied (logs, MANIFESTs grow)."""
    if source.endswith(".sst"):
        os.link(source, target)
    else:
        shutil.copy2(source, target)


def kill_all(home: Path) -> None:
    """``kill -9`` of every process whose command line names ``home`` and of its process group
    (the supervisor's drivers lead groups of their own), then wait until none is left."""
    for _ in range(100):
        pids = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and str(home).encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
        time.sleep(0.1)
    raise RuntimeError(f"drivers on {home} still running: {pids}")


def trial(home: Path, appender: Appender, after: int, root: Path, idle_s: float) -> dict:
    """One takeover on ``home`` by ``root``'s driver, its standby warm for ``idle_s`` before
    the kill, then ``after`` micro-batches."""
    run = start_driver("cutline", home, BATCH, "--standby", root=root)
    try:
        out = {"idle_s": idle_s, **takeover(run, appender, BATCH, idle_s)}
        durations = []
        for _ in range(after):
            seen = len(run.batches)
            appender.append(BATCH * PARTITIONS)
            if not wait_until(
                lambda seen=seen: any(b.records for b in run.batches[seen:]),
                time.monotonic() + 300,
                run,
                "a micro-batch after the takeover",
            ):
                break
            durations.append(next(b for b in run.batches[seen:] if b.records).ms)
        out["after_batch_ms"] = durations
        return out
    finally:
        run.kill()
        kill_all(home)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="takeovers per checkout")
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--sustain", type=float, default=60.0, help="seconds before the kill")
    parser.add_argument("--after", type=int, default=3, help="micro-batches after each takeover")
    parser.add_argument("--log-format", choices=FORMATS, default="arrow")
    parser.add_argument(
        "--work", type=Path, help="keep the state here, and take it again (default: a temp dir)"
    )
    parser.add_argument(
        "--evict", action="store_true", help="start each trial with the state's files uncached"
    )
    parser.add_argument(
        "--idle",
        type=float,
        nargs="+",
        default=[2.0],
        help="seconds the warm standby (and the active driver, without input) idle before the "
        "kill; several: the trials take them in turn",
    )
    add_checkouts(parser, "take over with")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "takeover.json")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="cutline-takeover-") as tmp:
        work = args.work or Path(tmp)
        killed, home = work / "killed", work / "home"
        built = killed / "built.json"  # a --work's state is taken again, not built again
        if not built.exists():
            for d in (killed, home):
                shutil.rmtree(d, ignore_errors=True)
            keys, ts = build_state(home, args.mib, args.log_format)
            ts = kill_mid_stream(home, keys, ts, args.sustain)
            # every trial's at the same path: a job's roots are recorded, and a wrong one refused
            shutil.copytree(home, killed, symlinks=True, copy_function=link_or_copy)
            built.write_text(json.dumps({"keys": keys, "ts": ts, "mib": args.mib}))
        state = json.loads(built.read_text())
        keys, ts = state["keys"], state["ts"]
        runs = []
        for i in range(args.repeat):
            for root, idle_s in itertools.product(args.checkouts, args.idle):
                if home.exists():  # the last trial's, or a --work's left
                    shutil.rmtree(home)
                shutil.copytree(killed, home, symlinks=True, copy_function=link_or_copy)
                if args.evict:  # as a machine leaves a state idle for minutes, every trial alike
                    drop(home.rglob("*.sst"))
                appender = Appender(log_writer(home / "log"), keys, 1, ts, seed=3 + i)
                run = {"commit": commit_of(root), **trial(home, appender, args.after, root, idle_s)}
                runs.append(run)
                print(f"takeover {i + 1}: {json.dumps(run)}", flush=True)
    by_commit = {}
    for commit, idle_s in dict.fromkeys((r["commit"], r["idle_s"]) for r in runs):
        mine = [r for r in runs if (r["commit"], r["idle_s"]) == (commit, idle_s)]
        mine = [r for r in mine if r["takeover_to_first_batch_s"]]
        later = [ms for r in mine for ms in r["after_batch_ms"]]
        commit = commit if len(args.idle) == 1 else f"{commit}, idle {idle_s:g} s"
        by_commit[commit] = {
            "takeover_s": statistics.median(r["takeover_to_first_batch_s"] for r in mine),
            "first_batch_s": statistics.median(
                r["takeover_phases_s"]["first micro-batch"] for r in mine
            ),
            "after_batch_ms": statistics.median(later) if later else None,
        }
        print(f"{commit}: medians {json.dumps(by_commit[commit])}")
    result = {
        "what": f"takeover of the peer benchmark's job at {args.mib} MiB of state, from a state a "
        f"driver killed after {args.sustain:.0f} s of sustained input left"
        f"{' (its files evicted from the page cache before each trial)' if args.evict else ''}"
        f": kill -9 of the active "
        f"driver to the standby's first micro-batch ({BATCH:,} records per partition, local[2]), "
        f"then {args.after} micro-batches of as many records",
        "runs": runs,
        "medians_by_commit": by_commit,
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
