"""The suite's own machinery: the tiers' seeded slices (tests/tiers.py) and the startup report
(tests/startup_report.py)."""

from __future__ import annotations

import random

import pytest

from tests import findings, startup_report, tiers


def test_runs_to_cover_against_exact_small_cases_and_a_simulation():
    assert tiers.runs_to_cover(5, 5) == 1.0
    # two cases, one drawn per run: the first run finds one, then each run 1/2: 1 + 2
    assert tiers.runs_to_cover(2, 1) == pytest.approx(3.0)
    # n cases, one per run: the coupon collector, n * H(n)
    assert tiers.runs_to_cover(4, 1) == pytest.approx(4 * (1 + 1 / 2 + 1 / 3 + 1 / 4))
    rng = random.Random(3)
    trials = []
    for _ in range(4000):
        seen, runs = set(), 0
        while len(seen) < 7:
            seen.update(rng.sample(range(7), 2))
            runs += 1
        trials.append(runs)
    assert sum(trials) / len(trials) == pytest.approx(tiers.runs_to_cover(7, 2), rel=0.03)


def test_a_slice_depends_on_the_seed_alone(monkeypatch):
    cases = [f"case-{i}" for i in range(16)]
    monkeypatch.setattr(tiers, "TIER", tiers.LANDING)
    monkeypatch.setattr(findings, "PENDING", [])  # what the draws record: not this test's
    monkeypatch.setattr(tiers, "SEED", 11)
    first = tiers.draw("kill points", cases)
    assert first == tiers.draw("kill points", cases), "a seed reruns its slice"
    assert len(first) == len(set(first)) == tiers.MATRICES["kill points"].landing
    assert [("drawn", ["kill points", c]) for c in first * 2] == findings.PENDING, "recorded"
    slices = set()
    for seed in range(12, 40):
        monkeypatch.setattr(tiers, "SEED", seed)
        slices.add(tuple(tiers.draw("kill points", cases)))
    assert len(slices) > 20, "other seeds draw other slices"
    monkeypatch.setattr(tiers, "TIER", tiers.ALL)
    assert sorted(tiers.draw("kill points", cases)) == sorted(cases), (
        "the whole tier draws every case"
    )


def test_an_unknown_matrix_is_refused():
    with pytest.raises(KeyError, match="no matrix"):
        tiers.record("kill point", "x")


def test_a_startup_line_splits_into_the_reports_columns():
    line = (
        "startup: 14.2 s from the process start: spark session 4.3 s, waiting for the plan "
        "0.0 s, query started 2.9 s, state restored 3.0 s, first trigger planned 0.4 s, "
        "first micro-batch 3.0 s (beside them: attempt and checkpoint 0.8 s, python workers "
        "warmed 5.1 s)"
    )
    assert startup_report.phases(line) == pytest.approx(
        {"session": 4.3, "query start": 2.9, "restore": 3.0, "first batch": 3.4}
    )


def test_each_worker_share_begins_with_its_part_of_the_slow_tests_longest_first():
    items = [f"fast-{i}" for i in range(6)] + ["slow-b", "slow-a", "slow-c"]
    slow = [i.startswith("slow") for i in items]
    place = [9] * 6 + [1, 0, 2]  # a before b before c
    two = tiers.longest_first(items, slow, place, 2)
    assert two[:4] == ["slow-a", "slow-c", "fast-0", "fast-1"]  # the first worker's 4 of 9
    assert two[4:] == ["slow-b", "fast-2", "fast-3", "fast-4", "fast-5"]
    assert tiers.longest_first(items, slow, place, 1) == ["slow-a", "slow-b", "slow-c"] + [
        f"fast-{i}" for i in range(6)
    ]
