"""The suite's two tiers and its one seed (a pytest plugin, loaded by ``tests/conftest.py``).

- ``make test`` (``CUTLINE_TEST_TIER=landing``, what CI runs): every test not marked ``slow``,
  every slow test marked ``landing`` (one end-to-end run per guarantee and feature), and a
  seeded slice of every fault matrix.
- ``make test-all`` (``CUTLINE_TEST_TIER=all``, also plain ``pytest``): everything, every
  matrix whole.

A fault matrix is a set of cases of which the landing tier draws a few per run:

- parametrized cases of one test, each marked ``@pytest.mark.matrix(NAME)`` (the slice
  deselects the others);
- or cases a test draws itself with :func:`draw` (kill points, GC pause points).

:data:`MATRICES` says how many cases a landing run draws of each; the draw depends on the seed
alone, so a printed seed reruns the same slice, and successive seeds cover each matrix whole
(docs/testing.md gives how many runs that takes on average: :func:`runs_to_cover`).

The seed is ``CUTLINE_TEST_SEED`` when set, otherwise drawn from the checked-out commit (so it
differs between commits and a rerun of one commit draws the same slice). It is printed at the
start and at the end of the run with the command that reruns the slice.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from tests import findings

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
SEED_ENV, TIER_ENV = "CUTLINE_TEST_SEED", "CUTLINE_TEST_TIER"
LANDING, ALL = "landing", "all"
COMMANDS = {LANDING: "make test", ALL: "make test-all"}


@dataclass(frozen=True)
class Matrix:
    """A fault matrix: ``landing`` of its cases run in each ``make test``."""

    name: str
    landing: int
    what: str


MATRICES = {
    m.name: m
    for m in (
        Matrix("kill jobs", 1, "jobs killed at random points (tests/test_exactly_once.py)"),
        Matrix("kill points", 5, "named kill points, random and in-flight kills, per job"),
        Matrix("fencing", 1, "two attempts, a zombie, a paused driver, an orphan manifest"),
        Matrix("gc kills", 2, "points of a GC pass killed with SIGKILL (tests/test_gc.py)"),
        Matrix("restore safety", 1, "damaged checkpoints, an older one by id, no start-over"),
        Matrix("bad records", 1, "a bad record failing the run, dead letters across a kill"),
        Matrix("cluster", 1, "a host lost; rescaled 2 -> 3 -> 1 -> 4 across two hosts"),
        Matrix("user jobs", 1, "evolution, a raising function, a pipeline transform"),
        Matrix("demo signals", 1, "make demo stopped by SIGTERM or SIGHUP"),
    )
}


# The modules of slow tests, longest tests first: runs start them first, so that with two
# workers (pytest-xdist) the last test to end is a short one. Slow tests of other modules follow
# them, then the rest, each in collection order.
LONGEST_FIRST = (
    "test_dagster_e2e", "test_cluster_recovery", "test_exactly_once", "test_s3_faults",
    "test_savepoint_runs", "test_gc", "test_restore_safety", "test_fencing", "test_user_jobs",
    "test_demo", "test_bad_records", "test_kafka", "test_compaction",
)  # fmt: skip


def _commit_seed() -> int | None:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return int(head[:12], 16) % (1 << 30)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _seed() -> tuple[int, str]:
    given = os.environ.get(SEED_ENV)
    if given:
        return int(given), f"from {SEED_ENV}"
    from_commit = _commit_seed()
    if from_commit is not None:
        return from_commit, "drawn from the commit"
    return random.SystemRandom().randrange(1 << 30), "drawn at random (no git commit)"


SEED, SEED_SOURCE = _seed()
TIER = os.environ.get(TIER_ENV, ALL)
if TIER not in COMMANDS:
    raise ValueError(f"{TIER_ENV}={TIER!r}: expected {LANDING!r} or {ALL!r}")

DRAWN: dict[str, list[str]] = {}  # matrix -> the cases the collection drew, for the header


def landing() -> bool:
    return TIER == LANDING


def rng(label: str) -> random.Random:
    """A random generator for ``label`` that depends on the run's seed alone."""
    return random.Random(f"{SEED}/{label}")


def _slice(matrix: str, cases: Sequence[T]) -> list[T]:
    order = list(cases)
    rng(f"{matrix}/").shuffle(order)
    return order[: MATRICES[matrix].landing] if landing() else order


def draw(matrix: str, cases: Sequence[T]) -> list[T]:
    """The cases of ``matrix`` this test takes: all of them in the whole tier, in an order drawn
    from the seed; in the landing tier, ``MATRICES[matrix].landing`` of them (distinct while
    there are enough). Each is recorded (:func:`record`)."""
    order = _slice(matrix, cases)
    for case in order:
        record(matrix, str(case))
    return order


def record(matrix: str, case: str) -> None:
    """Note a case of ``matrix`` the running test drew (listed at the end of the run)."""
    if matrix not in MATRICES:
        raise KeyError(f"no matrix {matrix!r} in tests/tiers.py")
    findings.note("drawn", [matrix, case])


def runs_to_cover(cases: int, drawn: int) -> float:
    """The expected number of runs, each drawing ``drawn`` distinct cases of ``cases`` at random,
    until every case was drawn at least once: the sum over r of P(some case is not drawn in r
    runs), by inclusion-exclusion over the cases never drawn."""
    if drawn >= cases:
        return 1.0
    total, runs = 1.0, 1  # no case is drawn in zero runs
    while True:
        missed = sum(
            (-1) ** (j + 1)
            * math.comb(cases, j)
            * (math.comb(cases - j, drawn) / math.comb(cases, drawn)) ** runs
            for j in range(1, cases - drawn + 1)
        )
        if missed < 1e-9:
            return total
        total += missed
        runs += 1


def rerun_line() -> str:
    return f"{SEED_ENV}={SEED} {COMMANDS[TIER]} reruns this slice"


# -- the plugin --------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "landing: a slow test that `make test` runs whole (one per guarantee)"
    )
    config.addinivalue_line(
        "markers",
        "matrix(name): a case of a fault matrix; `make test` runs a seeded slice of its cases",
    )


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"cutline tier: {TIER} ({COMMANDS[TIER]}); seed {SEED} {SEED_SOURCE}: {rerun_line()}"]


def _place(item: pytest.Item) -> int:
    module = item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


def longest_first(items: list[T], slow: list[bool], place: list[int], workers: int) -> list[T]:
    """``items`` ordered for ``workers`` pytest-xdist workers: the work-stealing scheduler
    gives each worker a contiguous share of the list (the first ``n // workers`` items to the
    first, and so on) and moves tests from the end of a busy worker's share to an idle one.
    So each share begins with its own part of the slow tests, dealt out longest first, and the
    others fill it, in collection order. With one worker: the slow tests first."""
    order = sorted(range(len(items)), key=lambda i: place[i])  # stable
    heavy = [i for i in order if slow[i]]
    light = [i for i in range(len(items)) if not slow[i]]
    out: list[int] = []
    remaining = len(items)
    for w in range(workers):
        share = remaining // (workers - w)  # the scheduler's first split
        remaining -= share
        dealt = heavy[w::workers]
        out += dealt
        fill = max(0, share - len(dealt))
        out += light[:fill]
        del light[:fill]
    out += light
    return [items[i] for i in out]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the landing tier, deselect slow tests that are neither ``landing`` nor drawn in their
    matrix's slice; then start the longest tests first (:func:`longest_first`)."""
    _select(config, items)
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    slow = [item.get_closest_marker("slow") is not None for item in items]
    items[:] = longest_first(items, slow, [_place(item) for item in items], workers)


def _select(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not landing():
        return
    by_matrix: dict[str, list[pytest.Item]] = {}
    for item in items:
        marker = item.get_closest_marker("matrix")
        if marker is not None:
            name = marker.args[0]
            if name not in MATRICES:
                raise pytest.UsageError(f"{item.nodeid}: no matrix {name!r} in tests/tiers.py")
            by_matrix.setdefault(name, []).append(item)
    chosen: dict[str, str] = {}  # nodeid -> its matrix
    for name, cases in sorted(by_matrix.items()):
        ids = _slice(name, sorted(item.nodeid for item in cases))
        DRAWN[name] = ids
        chosen.update(dict.fromkeys(ids, name))
    keep, drop = [], []
    for item in items:
        if item.get_closest_marker("matrix") is not None:
            if item.nodeid in chosen:
                drawn = [chosen[item.nodeid], item.nodeid]
                item.user_properties.append(findings.item_finding("drawn", drawn))
                keep.append(item)
            else:
                drop.append(item)
        elif item.get_closest_marker("slow") is None or item.get_closest_marker("landing"):
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    return _slice_lines(DRAWN)  # (with xdist the workers collect: the summary has the slice)


def _slice_lines(drawn: dict[str, list[str]]) -> list[str]:
    lines = []
    for name, cases in sorted(drawn.items()):
        matrix = MATRICES[name]
        lines.append(f"slice of {name!r} ({matrix.what}):")
        lines.extend(f"    {case}" for case in cases)
    return lines


def pytest_terminal_summary(terminalreporter) -> None:
    """The cases every test drew, the tier and the seed."""
    drawn: dict[str, list[str]] = {}
    for name, case in findings.collected("drawn"):
        drawn.setdefault(name, []).append(case)
    terminalreporter.section("cutline tier and seed")
    for line in _slice_lines(drawn):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"tier {TIER}, seed {SEED} ({SEED_SOURCE}): {rerun_line()}")
