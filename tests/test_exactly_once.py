"""Exactly-once, shown: drivers killed with SIGKILL at points drawn at random from a printed seed,
across the whole protocol, many times per run; the output is compared with an answer computed
from the input by pandas (tests/reference.py), never with another Cutline run.

A kill lands at a named point of the protocol (``state.faults.KILL_POINTS``: while the start is
planned, while subtasks restore, after the sink's commit is redone, inside a micro-batch's tasks,
with snapshot uploads in flight, between ``_metadata`` and the catalog commit, between the catalog
commit and the sink commit, inside the sink commit), counted only when the point's own record
says it fired; or at a random moment within 4 s of the attempt's first micro-batch (never during
the JVM's start, which proves nothing), with or without uploads slowed down so that checkpoints
are pending, counted only if the attempt was still running. Savepoints are taken and
restored under the kills: an attempt killed while it writes one (``SAVEPOINT_KILL_POINTS``:
mid-copy, before its catalog row, before its request is cleared; a stop-with-savepoint half the
time) has a request stored before it starts, as do a fifth of the others; one killed while it
imports one starts with ``--restore`` of a savepoint taken earlier, as do a fifth of the others
once there is one (so a restore from a savepoint completes, then the kill); every request must end
served exactly once, whole, with nothing half-written left. Input is appended between attempts
(records to the local log, in JSON lines or, for ``ARROW_LOG``'s jobs, in Arrow segments; or new
files to the file source's directory). The output is compared
epoch by epoch with the reference (tests/reference.py). Some jobs run with every durable role on
the S3 server on loopback (checkpoints, catalog, output tables, staged epochs; the file source's
files too); after their kills a GC pass must leave exactly what the retained checkpoints need,
each of which verifies, checksums included. ``sessions`` (keyed state and event-time timers)
and ``country_clicks`` (two stages, the second re-keyed) change parallelism at every attempt
(``RESCALED``): each restore after a kill is rescaled, the last one always (an attempt killed
before its restore completes rescales nothing). The restart after each kill is drawn from the
seed (``TAKEOVER``): a cold start (the next ``cutline run``) or a standby's takeover (the attempt
runs with ``--standby`` and its active driver is killed; the warm standby restores the latest
checkpoint and runs to the end of the input). Such an attempt starts with a lead of its input (a
quarter of its records, or a small file of its own: its first micro-batch, after which the
standby is launched) and gets the rest once its standby is warm; a point it reaches at every
micro-batch or checkpoint counts only from then; a point reached once, at the start, comes before
any standby (launched after the first micro-batch), and its restart is cold. After the attempts,
the Delta logs of the catalog and of every sink's table, read commit by commit, show no commit
from a fenced attempt (tests/fence_check.py). Reproduce a run with ``CUTLINE_TEST_SEED``; set
``CUTLINE_TEST_KILLS`` for more kills.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_jobs.catalog.tables import CatalogReader
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.errors import EXIT_FAILED
from spark_jobs.job_loader import get_job, job_name_of
from spark_jobs.sources.generate import generate
from state.catalog import CheckpointStatus
from state.faults import AFTER_ENV, KILL_POINTS, RECORD_ENV, SAVEPOINT_KILL_POINTS
from state.faults import ENV as KILL_ENV
from state.paths import JobLayout, SavepointLayout
from state.restore import read_manifest
from state.savepoint import SavepointRequest, read_request, read_savepoint, write_request
from state.storage import open_storage
from state.storage.tables import join_url
from tests import tiers
from tests.e2e_util import (
    active_driver,
    cutline,
    finish,
    gc_left_only_what_is_needed,
    kill_driver,
    report,
    run_to_end,
)
from tests.fence_check import fenced_commits
from tests.file_input import clicks, put_file, read_files
from tests.file_jobs import FILES_ENV
from tests.reference import check, output, read_log
from tests.state_check import check_country_state

pytestmark = [pytest.mark.slow, pytest.mark.spark]

# kills per job: ten in the whole tier, five in `make test` (which draws one job)
KILLS = int(os.environ.get("CUTLINE_TEST_KILLS") or (5 if tiers.landing() else 10))
RUN = ["--idle-timeout", "3", "--interval-ms", "1000", "--max-records-per-partition", "4000"]
TO_END = ["--until-caught-up", *RUN[2:]]  # the runs after the kills read what there is, then stop
FILE_JOB = "tests.file_jobs:file_clicks"
# per job: (kind, records per partition at first, records per partition appended per attempt)
INPUTS = {
    # clicks_per_user's count, then a two-input stage joining its output with a second source
    # (clicks_per_user itself is killed at chosen points in test_fencing, test_restore_safety,
    # test_gc and the at-least-once test below)
    "cutline_sessions.pipelines:profiled_clicks": [
        ("clicks", 16_000, 4_000),
        ("profiles", 3_000, 1_000),
    ],
    "windowed_revenue": [("orders", 16_000, 4_000)],
    "enriched_orders": [("orders", 12_000, 3_000), ("profiles", 3_000, 1_000)],
    # a user's job from its own package (examples/sessions), run as module:attr
    "cutline_sessions.jobs:sessions": [("clicks", 16_000, 4_000)],
    # a transform and two keyed stages, the second re-keying the first's output; two sinks
    "cutline_sessions.pipelines:country_clicks": [("clicks", 16_000, 4_000)],
    # two stages keyed by composite keys, the second re-partitioning by (url, bucket)
    "cutline_sessions.pipelines:page_visits": [("clicks", 16_000, 4_000)],
    # the file source (tests/file_jobs.py): clicks_per_user over JSON files of 4,000 clicks each,
    # each file a partition: (kind, files at first, files added per attempt)
    FILE_JOB: [("files", 4, 1)],
}
# jobs whose local log is in Arrow segments (positions in records), the others' in JSON lines
ARROW_LOG = {"windowed_revenue", "cutline_sessions.pipelines:country_clicks"}
ON_S3 = {"windowed_revenue", "enriched_orders", "cutline_sessions.jobs:sessions", FILE_JOB}
# per job: more arguments of every attempt (a file is read in micro-batches of 1,000 records)
ARGS = {FILE_JOB: ["--max-records-per-partition", "1000"]}
# per job: the parallelism of attempt k is the k-th of these, cycling: each restore after a
# kill is rescaled (keyed state and event-time timers redistributed by key group)
RESCALED = {
    "cutline_sessions.jobs:sessions": [2, 3, 1, 4],  # keyed state and event-time timers
    "cutline_sessions.pipelines:country_clicks": [2, 4, 1, 3],  # two stages, re-keyed, upserts
}
STATE_READ = "cutline_sessions.pipelines:country_clicks"  # its state read out after the kills
IN_TASKS = {"subtask-restored", "batch-applied", "snapshot-taken"}  # counted per Python worker
PER_FILE = {"savepoint-copying", "savepoint-importing"}  # once per file copied
# reached at every micro-batch or checkpoint
REPEATED = {"batch-applied", "snapshot-taken", "metadata-written", "catalog-committed",
            "sink-committing", "sink-committed"}  # fmt: skip
ONCE = {"restore-started", "sink-recovered", "savepoint-written", "savepoint-recorded",
        "savepoint-imported"}  # reached once per attempt  # fmt: skip
# an attempt killed while a savepoint is written has a request stored before it starts (a stop
# one half the time); one killed while it imports a savepoint starts from one taken earlier
WRITING = {"savepoint-copying", "savepoint-written", "savepoint-recorded"}
IMPORTING = {"savepoint-importing", "savepoint-imported"}
MODES = [*KILL_POINTS, *SAVEPOINT_KILL_POINTS, "random", "uploads in flight"]
ALSO_SAVED = 0.2  # how often an attempt killed elsewhere has a savepoint request too
ALSO_RESTORED = 0.2  # how often one starts from a savepoint taken earlier (killed after that)
TAKEOVER = 0.5  # how often an attempt runs with a standby, which its kill's restart is
# A standby's attempt waits this long for its input: the standby is launched after the active
# driver's first micro-batch (the input's lead) and is warm 8 to 20 s later on two busy cores
TAKEOVER_IDLE_S = 60
LEAD_FILE_CLICKS = 1_000  # the file job's lead: one file of this many clicks
INTERRUPTED = 130  # a takeover's attempt, interrupted once the new driver read the whole input


def other_than_latest(paths: RuntimePaths, job: str) -> int:
    """A parallelism of ``RESCALED[job]`` other than its latest completed checkpoint's."""
    rows = CatalogReader(paths.catalog).checkpoints(job_name_of(job), (CheckpointStatus.COMPLETED,))
    latest = read_manifest(open_storage(paths.checkpoint_root), rows[-1].metadata_path)
    taken = max(h.subtask for h in latest.subtasks) + 1
    return next(p for p in RESCALED[job] if p != taken)


def append_input(home: Path, job: str, attempt: int, part: str = "all") -> None:
    """Attempt ``attempt``'s new input (from 0, the first has more): records appended to the
    local log, or new files in ``$CUTLINE_TEST_FILES``. ``part``: ``"all"`` of it, or its
    ``"lead"`` (a quarter of each partition's records, or a lead file) and later the
    ``"rest"``, for an attempt whose input arrives once its standby is warm."""
    for kind, initial, more in INPUTS[job]:
        count = initial if attempt == 0 else more
        if kind == "files":
            if part == "lead":  # one more file, of its own name
                put_file(os.environ[FILES_ENV], f"clicks-lead-{attempt:03d}.json",
                         clicks(LEAD_FILE_CLICKS, 1_000 + attempt))  # fmt: skip
                continue
            first = 0 if attempt == 0 else initial + (attempt - 1) * more
            for n in range(first, first + count):
                put_file(os.environ[FILES_ENV], f"clicks-{n:03d}.json", clicks(4_000, n))
        else:  # the log's records follow from their offsets: a lead and its rest are the whole
            lead = count // 4
            count = {"all": count, "lead": lead, "rest": count - lead}[part]
            fmt = "arrow" if job in ARROW_LOG else "jsonl"
            generate(home / "log", kind, kind, count=count, seed=7, users=3_000, fmt=fmt)


def savepoints_of(paths: RuntimePaths, job: str) -> list[dict]:
    return CatalogReader(paths.catalog).savepoints(job_name_of(job))


def ask_for_savepoint(paths: RuntimePaths, job: str, stop: bool) -> None:
    """Store a savepoint request for the next attempt, unless one is pending (it waits)."""
    storage, layout = open_storage(paths.checkpoint_root), JobLayout(job_name_of(job))
    if read_request(storage, layout) is None:
        write_request(storage, layout, SavepointRequest.new("", stop, int(time.time() * 1000)))


def kill_modes(job: str) -> Iterator[str]:
    """The modes ``job``'s attempts are killed in, in order, cycling: a run of ``KILLS``
    consecutive modes of one permutation of ``MODES`` drawn from the seed, starting at the job's
    index times ``KILLS``. The whole tier's seven jobs thus draw every mode; a landing run's one
    job draws five (the "kill points" matrix of tests/tiers.py). An attempt that ends before its
    kill lands takes the next mode."""
    modes = list(MODES)
    tiers.rng("kill points").shuffle(modes)
    start = list(INPUTS).index(job) * KILLS % len(modes)
    return itertools.cycle(modes[start:] + modes[:start])


def one_attempt(
    home: Path,
    paths: RuntimePaths,
    job: str,
    rng: random.Random,
    mode: str,
    flags: list[str],
    from_savepoint: list[str],
    append: Callable[[str], None],
    takeover: bool = False,
) -> str | None:
    """Start an attempt and kill it in ``mode`` (details as ``rng`` says); what killed it, or
    None if it ended. ``append(part)`` adds the attempt's new input (``append_input``), before
    it starts. An attempt started from a savepoint appends its mode to ``from_savepoint``. With
    ``takeover`` the attempt runs with a standby driver, which takes over after the kill (if it
    was launched by then) and runs to the end of the input; killed at a random moment or at a
    point reached at every micro-batch, such an attempt starts with its input's lead (its first
    micro-batch, after which the supervisor launches the standby; without one a restore that
    left nothing to read would launch none), waits for its standby to be warm
    (``TAKEOVER_IDLE_S`` without input) and gets the rest then."""
    saved = [r["location"] for r in savepoints_of(paths, job) if r["status"] == "COMPLETED"]
    if mode in IMPORTING and not saved:
        mode = "savepoint-written"  # nothing to import yet: one is taken
    if mode in IMPORTING or (saved and mode not in WRITING and rng.random() < ALSO_RESTORED):
        flags = [*flags, "--restore", rng.choice(saved)]
        from_savepoint.append(mode)
    elif mode in WRITING or rng.random() < ALSO_SAVED:
        ask_for_savepoint(paths, job, stop=mode in WRITING and rng.random() < 0.5)
    # one takeover: a standby launched after it would only be stopped with the attempt
    standby = ["--standby", "--takeovers", "1"] if takeover else []
    standby_env = {"CUTLINE_EVENTS": "stdout"} if takeover else {}  # the supervisor's events
    timed = mode in ("random", "uploads in flight")
    # with a standby, a point reached at every micro-batch or checkpoint is armed once the
    # standby is warm, and the attempt's input arrives then: its kill's restart is a takeover
    armed_later = takeover and mode in REPEATED
    warm_first = takeover and (timed or armed_later)  # its input's rest once its standby is warm
    append("lead" if warm_first else "all")
    if not timed:
        # armed later: the first time after that (one micro-batch of input, one checkpoint)
        nth = 1 if mode in ONCE or armed_later else rng.randint(1, times_reached(mode, job))
        if from_savepoint and from_savepoint[-1] == mode and "--restore" in flags:
            from_savepoint[-1] = f"{mode}@{nth}"
        record = home / "faults.log"  # where the kill point says it fired (state/faults.py)
        record.unlink(missing_ok=True)
        env = {KILL_ENV: f"{mode}@{nth}", RECORD_ENV: str(record), **standby_env}
        gate = home / "faults.armed"
        gate.unlink(missing_ok=True)
        idle = []
        if armed_later:
            env[AFTER_ENV] = str(gate)
            idle = ["--idle-timeout", str(TAKEOVER_IDLE_S)]
        since = log_size(home)
        proc = cutline(home, "run", job, *RUN, *idle, *flags, *standby, env=env)
        if armed_later:
            if standby_warm(proc, home, since):
                gate.touch()
            append("rest")
        rc = end_of_takeover(proc, home, since) if takeover else finish(proc, timeout=300)
        fired = record.exists() and f"killed at {mode}\n" in record.read_text()
        log = (home / "driver.log").read_text(errors="replace")
        # killed at the point: SIGKILL of the driver's process group, which can reach the driver
        # a moment after its JVM died under it and a native thread crashed (SIGSEGV); under a
        # supervisor, the standby took over (interrupted once it read everything: 130), or there
        # was none yet (1: a cold start next)
        killed = fired and (rc in (INTERRUPTED, EXIT_FAILED) if takeover else rc < 0)
        assert rc == 0 or killed, f"attempt exited {rc}: {log[-4000:]}"
        if not killed:
            return None
        return f"{mode}@{nth}" + (restarted(log[since:], rc) if takeover else "")
    record = home / "faults.log"  # where slowed uploads note their start and end
    record.unlink(missing_ok=True)
    env = {RECORD_ENV: str(record), **standby_env}
    if mode == "uploads in flight":
        env["CUTLINE_FAULT_UPLOAD_DELAY_S"] = "3"
    delay = rng.uniform(0.0, 4.0)
    log = home / "driver.log"
    since = log_size(home)
    idle = ["--idle-timeout", str(TAKEOVER_IDLE_S)] if takeover else []
    proc = cutline(home, "run", job, *RUN, *idle, *flags, *standby, env=env)
    # timed from this attempt's first micro-batch: a kill during the JVM's start proves nothing;
    # with a standby, from its standby's being warm and the input's arrival
    if takeover:
        standby_warm(proc, home, since)
        append("rest")
    while proc.poll() is None and b"\nstartup: " not in log.read_bytes()[since:]:
        time.sleep(0.1)
    deadline = time.monotonic() + delay
    while proc.poll() is None and (
        time.monotonic() < deadline or (mode == "uploads in flight" and not pending(record))
    ):  # in flight: not before an upload is pending (the next barrier's, at the latest)
        time.sleep(0.05)
    if proc.poll() is not None:  # ended before the kill: not counted
        assert proc.returncode == 0, log.read_text(errors="replace")[-4000:]
        return None
    if takeover:
        try:
            os.killpg(active_driver(log.read_text(errors="replace")[since:]), signal.SIGKILL)
        except ProcessLookupError:  # it ended by itself (a stop with savepoint) while its
            rc = finish(proc, timeout=300)  # supervisor stops the standby: not counted
            text = log.read_text(errors="replace")[since:]
            assert rc == 0 and " takes over " not in text, f"exited {rc}: {text[-4000:]}"
            return None
    else:
        kill_driver(proc)
    cut_off = pending(record)  # before a takeover's own uploads begin
    if takeover:
        rc = end_of_takeover(proc, home, since)
        text = log.read_text(errors="replace")
        assert rc == INTERRUPTED, f"the takeover's attempt exited {rc}: {text[-4000:]}"
        assert "takes over" in text[since:], "a warm standby took over"
    how = " taken over" if takeover else ""
    if mode == "uploads in flight":  # counted only if an upload was cut off by the kill
        return (
            f"{mode} ({cut_off} pending) {delay:.1f} s after the first micro-batch{how}"
            if cut_off
            else None
        )
    return f"{mode} {delay:.1f} s after the first micro-batch{how}"


def times_reached(mode: str, job: str) -> int:
    """How many times an attempt surely reaches the point ``mode`` in one of its processes: a
    subtask's restore once per stage in each Python worker (a slot's task restores every
    stage's subtask in turn), a point in tasks or per file copied twice, the others three
    times (micro-batches and checkpoints)."""
    if mode == "subtask-restored":
        return len(get_job(job).stages)
    return 2 if mode in IN_TASKS | PER_FILE else 3


def log_size(home: Path) -> int:
    log = home / "driver.log"
    return log.stat().st_size if log.exists() else 0


def standby_warm(proc: subprocess.Popen, home: Path, since: int) -> bool:
    """Wait until the attempt's standby is warm (its line in the log after ``since``); whether
    the attempt is still running."""
    log = home / "driver.log"
    while proc.poll() is None and b"warm, waiting" not in log.read_bytes()[since:]:
        time.sleep(0.1)
    return proc.poll() is None


def end_of_takeover(proc: subprocess.Popen, home: Path, since: int) -> int:
    """The exit code of an attempt run with a standby (its log from ``since``): once its
    standby took over and read the whole input (the new driver says it waits for input), the
    attempt is interrupted (:data:`INTERRUPTED`, whatever its drivers exited with: one
    interrupted in its JVM's start exits otherwise; the idle timeout would only add waiting); it
    ends by itself when its standby was gone at the kill (1) or no kill came (0)."""
    log = home / "driver.log"
    deadline = time.monotonic() + 300
    while proc.poll() is None:
        text = log.read_bytes()[since:]
        # after the new driver's startup line: a late line of the killed one is not its own
        taken = text.find(b" takes over (takeover ")
        started = text.find(b"from the takeover's order", taken) if taken >= 0 else -1
        if started >= 0 and b"waiting for new input" in text[started:]:
            proc.send_signal(signal.SIGINT)  # the supervisor passes it to its drivers
            finish(proc, timeout=120)  # the drivers' own exit codes after it vary: not asserted
            return INTERRUPTED
        if time.monotonic() > deadline:
            kill_driver(proc)
            raise AssertionError(f"the takeover did not read its input in 300 s: {text[-4000:]}")
        time.sleep(0.2)
    return finish(proc, timeout=120)


def restarted(log: str, rc: int) -> str:
    """How an attempt run with a standby was restarted after its driver's kill, from its log:
    its standby took over (and ran to the end), or none was launched yet."""
    if rc == INTERRUPTED:
        assert "takes over" in log, log[-4000:]
        return " taken over"
    assert "the standby is gone" in log, log[-4000:]
    return " (no standby yet: cold)"


def before_the_import(mode: str, job: str) -> bool:
    """Whether a kill in ``mode`` (``point@nth`` for a named point) of an attempt started from
    a savepoint lands before the savepoint is imported: at the import's own points, at
    restore-started, or at one of the start's fence commits (the first of each sink's)."""
    point, _, nth = mode.partition("@")
    if point in {*IMPORTING, "restore-started"}:
        return True
    fences = len(get_job(job).sinks())
    return point in ("sink-committing", "sink-committed") and int(nth or 0) <= fences


def pending(record: Path) -> int:
    """Uploads started and not ended, as the slowed uploads noted them (state/faults.py)."""
    lines = record.read_text().splitlines() if record.exists() else []
    started = {ln.split()[-1] for ln in lines if ln.startswith("upload started ")}
    return len(started - {ln.split()[-1] for ln in lines if ln.startswith("upload ended ")})


@pytest.mark.matrix("kill jobs")
@pytest.mark.parametrize(
    "job",
    [pytest.param(job, marks=pytest.mark.s3, id=f"{job}-s3") if job in ON_S3 else job
     for job in INPUTS],
)  # fmt: skip
def test_kills_at_random_points_of_the_protocol_lose_and_duplicate_nothing(job, tmp_path, request):
    rng = random.Random(f"{tiers.SEED}/{job}")
    report(f"\n{job}: seed {tiers.SEED} (CUTLINE_TEST_SEED={tiers.SEED} reproduces the kill plan)")
    home = tmp_path / "home"
    paths = RuntimePaths.under(home)
    if job in ON_S3:  # every durable role on the S3 server
        root = request.getfixturevalue("s3_root")
        paths = dataclasses.replace(paths, checkpoint_root=f"{root}/chk", warehouse=f"{root}/wh")
    if job == FILE_JOB:  # its files beside the roles: on the S3 server
        request.getfixturevalue("monkeypatch").setenv(FILES_ENV, f"{root}/files")
    roles = ["--checkpoint-root", paths.checkpoint_root, "--warehouse", paths.warehouse]
    flags = [*roles, *ARGS.get(job, [])]  # every attempt's
    schedule = RESCALED.get(job)

    def at(attempt: int) -> list[str]:  # the attempt's parallelism, when the job is rescaled
        return ["--parallelism", str(schedule[attempt % len(schedule)])] if schedule else []

    kills: list[str] = []
    attempts = 0
    modes = kill_modes(job)
    takeovers = tiers.rng(f"takeovers/{job}")  # which attempts run with a standby
    from_savepoint: list[str] = []  # the modes of attempts started from a savepoint
    while len(kills) < KILLS:
        assert attempts < 4 * KILLS, f"only {len(kills)} kills in {attempts} attempts: {kills}"
        mode = next(modes)
        # the first attempt never: its input must be there before it starts
        standby = takeovers.random() < TAKEOVER and attempts > 0
        killed = one_attempt(
            home,
            paths,
            job,
            rng,
            mode,
            [*flags, *at(attempts)],
            from_savepoint,
            functools.partial(append_input, home, job, attempts),
            standby,
        )
        tiers.record("kill points", f"{job}: {mode}: {killed or 'ended before its kill'}")
        attempts += 1
        if killed:
            kills.append(killed)
    killed_log = (home / "driver.log").read_text(errors="replace")  # the kills' attempts
    # the rest of the input in bigger micro-batches: the kills are over; a rescaled job's last
    # restore rescales whatever the kills left (attempts killed before their restore do not)
    last = [] if schedule is None else ["--parallelism", str(other_than_latest(paths, job))]
    rest = [*flags, *at(attempts), *last, "--max-records-per-partition", "16000"]
    stop = read_request(open_storage(paths.checkpoint_root), JobLayout(job_name_of(job)))
    if stop is not None and stop.stop:  # a stop request still pending stops one more attempt
        run_to_end(home, "run", job, *TO_END, *rest)
    ask_for_savepoint(paths, job, stop=False)  # the last attempt takes one: at least one is
    run_to_end(home, "run", job, *TO_END, *rest)
    read = (lambda _: read_files(os.environ[FILES_ENV])) if job == FILE_JOB else None
    summary = check(job_name_of(job), home, paths.output, read)
    report(f"{job}: {len(kills)} kills in {attempts} attempts: {kills}")
    report(f"{job}: {sum('taken over' in k for k in kills)} of the kills' restarts were takeovers")
    report(f"{job}: output == reference ({summary})")
    if job == STATE_READ:  # its state, read out of the latest checkpoint, is the reference's
        summary = check_country_state(home, job, request.getfixturevalue("spark"))
        report(f"{job}: its state read out == reference ({summary})")
    if schedule:
        log = (home / "driver.log").read_text(errors="replace")
        rescales = log.count("\nrescaled: ")
        joins = re.findall(r"(\d+) joined several by files, (\d+) by copying keys", log)
        # the kills' restores themselves are rescaled, not only the last one after them: the
        # schedule gives consecutive attempts other parallelisms (a restore at the same one
        # follows three attempts in a row killed before their first checkpoint, or restores a
        # savepoint taken at it)
        restores = killed_log.count("\nrestored checkpoint ")
        rescaled = killed_log.count("\nrescaled: ")
        report(
            f"{job}: {rescales} restores rescaled, {rescaled} of the kills' {restores} "
            f"(parallelism cycling {schedule}); subtasks built from several old ones: "
            f"{sum(int(f) for f, _ in joins)} joined their files, "
            f"{sum(int(k) for _, k in joins)} copied their keys"
        )
        assert rescales > rescaled, "the last restore rescales whatever the kills left"
        if restores >= 2:  # the schedule makes a restore at the checkpoint's parallelism rare
            assert rescaled >= 1, f"none of the kills' {restores} restores was rescaled"
    report(f"{job}: {check_savepoints(home, paths, job)}")
    late, checked = fenced_commits(paths.catalog, paths.output, get_job(job))
    assert not late, f"commits from fenced attempts: {late}"
    begun = len(CatalogReader(paths.catalog).jobs(job_name_of(job)))
    report(f"{job}: no commit from a fenced attempt among {begun} attempts ({checked})")
    # an attempt started from a savepoint imports it while its start is planned: before any
    # kill but one at the import's own points or before it (the sinks' fences, each a sink
    # commit, then restore-started)
    imported = killed_log.count(") imported as checkpoint ")
    required = sum(1 for m in from_savepoint if not before_the_import(m, job))
    assert imported >= required, (
        f"{imported} imports by {len(from_savepoint)} attempts: {from_savepoint}"
    )
    if job in ON_S3:
        run_to_end(home, "gc", job, "--grace-s", "0", *roles)
        kept = gc_left_only_what_is_needed(paths, job_name_of(job))
        # and what it left restores: new input after it, the output still the reference's
        append_input(home, job, attempts)
        run_to_end(home, "run", job, *TO_END, *rest)
        summary = check(job_name_of(job), home, paths.output, read)
        report(f"{job}: on S3, GC left exactly what checkpoints {kept} need; restored: {summary}")


def check_savepoints(home: Path, paths: RuntimePaths, job: str) -> str:
    """Across the kills every savepoint request was served exactly once: each one taken is
    whole (every checksum), none failed, no request has two, none is pending, and every
    directory under the job's savepoint root is a recorded savepoint (none left half-written).
    Says what it saw."""
    name = job_name_of(job)
    storage = open_storage(paths.checkpoint_root)
    assert read_request(storage, JobLayout(name)) is None, "a savepoint request left unserved"
    rows = savepoints_of(paths, job)
    assert all(r["status"] == "COMPLETED" for r in rows), [r["reason"] for r in rows]
    assert rows, "the last attempt takes a savepoint"
    requests = [r["request_id"] for r in rows]
    assert len(requests) == len(set(requests)), f"a request served twice: {sorted(requests)}"
    for row in rows:
        assert read_savepoint(open_storage(row["location"])).job_id == name
    root = open_storage(join_url(paths.savepoints, name))
    directories = {f.path.split("/")[0] for f in root.list()}
    recorded = {r["location"].rstrip("/").rsplit("/", 1)[-1] for r in rows}
    whole = {d for d in directories if root.exists(f"{d}/{SavepointLayout.METADATA}")}
    assert directories == recorded == whole, (directories, recorded)
    log = (home / "driver.log").read_text(errors="replace")
    imported = log.count(") imported as checkpoint ")
    return f"{len(rows)} savepoints, each whole and recorded once; {imported} restored from"


@pytest.mark.landing
def test_at_least_once_loses_nothing_and_reports_duplicates(tmp_path):
    """At least once: output is appended every micro-batch, so a replay after a kill appends
    it again. Nothing is lost: every user's final count is the input's. (One checkpoint, at the
    first micro-batch, then none for a minute: the kill in the third leaves output ahead of it.)"""
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=40_000, seed=7, users=3_000)
    args = [*RUN, "--mode", "at_least_once"]
    rare = [*args, "--interval-ms", "60000"]
    proc = cutline(home, "run", "clicks_per_user", *rare, env={KILL_ENV: "batch-applied@3"})
    assert finish(proc) == -9
    run_to_end(home, "run", "clicks_per_user", *args)
    got = output(home, "clicks_per_user")
    duplicates = int(got.duplicated(["user", "clicks"]).sum())
    report(f"at-least-once after one kill: {duplicates} duplicate rows")
    assert duplicates > 0, "the kill left output ahead of the checkpoint, which a replay repeats"
    final = got.groupby("user")["clicks"].max()
    expected = read_log(home, "clicks").groupby("user").size()
    assert final.sort_index().tolist() == expected.sort_index().tolist(), "nothing is lost"
    with pytest.raises(AssertionError) as failure:  # not exactly once, and the check says so
        check("clicks_per_user", home)
    report(f"the exactly-once check refuses it: {str(failure.value).splitlines()[0]}")
