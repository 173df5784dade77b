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

DRAWN: dict[str, list[str]] = {}  # matrix -> the cases this run drew, for the summary


def landing() -> bool:
    return TIER == LANDING


def rng(label: str) -> random.Random:
    """A random generator for ``label`` that depends on the run's seed alone."""
    return random.Random(f"{SEED}/{label}")


def draw(matrix: str, cases: Sequence[T]) -> list[T]:
    """The cases of ``matrix`` this run takes: all of them in the whole tier, in an order drawn
    from the seed; in the landing tier, ``MATRICES[matrix].landing`` of them (distinct while
    there are enough)."""
    order = list(cases)
    rng(f"{matrix}/").shuffle(order)
    if landing():
        order = order[: MATRICES[matrix].landing]
    for case in order:
        record(matrix, str(case))
    return order


def record(matrix: str, case: str) -> None:
    """Note a case of ``matrix`` this run draws (listed at the end of the run)."""
    if matrix not in MATRICES:
        raise KeyError(f"no matrix {matrix!r} in tests/tiers.py")
    DRAWN.setdefault(matrix, []).append(case)


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the landing tier: deselect slow tests that are neither ``landing`` nor drawn in their
    matrix's slice."""
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
    chosen = set()
    for name, cases in sorted(by_matrix.items()):
        ids = draw(name, sorted(item.nodeid for item in cases))
        chosen.update(ids)
    keep, drop = [], []
    for item in items:
        if item.get_closest_marker("matrix") is not None:
            (keep if item.nodeid in chosen else drop).append(item)
        elif item.get_closest_marker("slow") is None or item.get_closest_marker("landing"):
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    return _slice_lines()


def _slice_lines() -> list[str]:
    lines = []
    for name, cases in sorted(DRAWN.items()):
        matrix = MATRICES[name]
        lines.append(f"slice of {name!r} ({matrix.what}):")
        lines.extend(f"    {case}" for case in cases)
    return lines


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.section("cutline tier and seed")
    for line in _slice_lines():
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"tier {TIER}, seed {SEED} ({SEED_SOURCE}): {rerun_line()}")
