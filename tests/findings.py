"""What tests find (figures they measured, cases of a matrix they drew, where their seconds
went), carried to the process that prints the run's summary (a pytest plugin, loaded by
``tests/conftest.py``).

With pytest-xdist (``make test`` runs two workers) a test runs in a worker process and the
summary is printed by the controlling one; without it, both are one process. Either way a
finding rides on its test's teardown report (``user_properties``, which xdist sends to the
controller), and :func:`collected` lists every test's findings of a kind in the order the
reports arrived, in the process that prints.

- :func:`note` during a test: the finding goes on that test's report;
- :func:`on_report` for a finding made at the report itself (a test's startup timeline);
- ``item.user_properties`` for one known at collection (the cases a slice drew): see
  :func:`item_finding`.
"""

from __future__ import annotations

from typing import Any

import pytest

PREFIX = "cutline:"
PENDING: list[tuple[str, Any]] = []  # this process's findings of the running test
COLLECTED: dict[str, list[Any]] = {}  # every test's, in the process that prints the summary


def note(kind: str, value: Any) -> None:
    """A finding of the running test (plain data: str, int, float, list, dict)."""
    PENDING.append((kind, value))


def item_finding(kind: str, value: Any) -> tuple[str, Any]:
    """A finding for ``item.user_properties``: reported with that test."""
    return f"{PREFIX}{kind}", value


def on_report(report: pytest.TestReport, kind: str, value: Any) -> None:
    report.user_properties.append(item_finding(kind, value))


def collected(kind: str) -> list[Any]:
    return COLLECTED.get(kind, [])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    if call.when == "teardown":
        report = outcome.get_result()
        for kind, value in PENDING:
            on_report(report, kind, value)
        PENDING.clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the controller (or the only process): keep what each test found."""
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if isinstance(name, str) and name.startswith(PREFIX):
            COLLECTED.setdefault(name.removeprefix(PREFIX), []).append(value)
