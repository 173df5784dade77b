"""Materialization metadata a person reads in the Dagster UI: sizes in MiB and durations in ms
or s (numbers, plotted, the unit in the key), identifiers as text (not plotted), tables as
Markdown."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dagster import MetadataValue

MIB = 1024 * 1024


def mib(size_bytes: int | float) -> MetadataValue:
    """A size in MiB (keys end in ``_mib``)."""
    return MetadataValue.float(round(size_bytes / MIB, 3))


def ident(value: Any) -> MetadataValue:
    """An identifier (checkpoint id, batch id, attempt, run id) as text: not a measurement."""
    return MetadataValue.text("none" if value is None else str(value))


def md_table(rows: Iterable[Mapping[str, Any]], columns: list[str], limit: int = 10):
    """The last ``limit`` rows as a Markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in list(rows)[-limit:]:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return MetadataValue.md("\n".join(lines))
