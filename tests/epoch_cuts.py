"""Where each committed epoch ended in the sources, and which epoch every input record fell in.

Every exactly-once sink commit records, in its Delta commit info (``cutline``), the source
positions at the end of each epoch it commits (cutline/sinks/delta.py). Read back from
the table's own history, those cuts are the only thing the reference takes from a run: every
record of the input belongs to the committed epoch whose cut first passes its position, and the
reference computes from the input alone what each epoch must have emitted (tests/reference.py).

The commits also record the processing time each epoch's micro-batch was planned with: the
clock by which an input partition goes idle, which the reference's watermarks need
(:func:`watermarks`).

A start-over's sink reset (a Delta DELETE) discards the epochs recorded before it: the new run
reads its input from the beginning again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from spark_jobs.catalog.tables import read_delta
from state.storage.tables import open_table

EPOCH = "_epoch"  # the sink's epoch column, and the epoch the reference assigns each record

Positions = dict[str, dict[str, int]]  # source -> partition -> position after the last record


@dataclass(frozen=True)
class EpochCuts:
    """The committed epochs, contiguous and ascending, where each ended per source and
    partition, and (``times``) the processing time each was planned with."""

    ends: dict[int, Positions]
    times: dict[int, int] = field(default_factory=dict)

    @property
    def epochs(self) -> list[int]:
        return sorted(self.ends)

    def contiguous(self, where: str) -> EpochCuts:
        """These cuts, after failing if the epochs have a gap: output of the missing epochs
        could never be checked."""
        epochs = self.epochs
        gaps = sorted(set(range(epochs[0], epochs[-1] + 1)) - set(epochs)) if epochs else []
        if gaps:
            raise AssertionError(f"{where}: no commit records where epochs {gaps} ended")
        return self

    def assign(self, records: pd.DataFrame, source: str) -> pd.DataFrame:
        """``records`` (with ``partition`` and ``offset``, the record's own position) with
        the committed epoch each fell in as ``_epoch``. Fails, naming partition and offset, for
        records that no committed epoch covers: after a run to the end of its input, such a
        record is lost."""
        epochs = np.array(self.epochs, dtype=np.int64)
        out = records.copy()
        out[EPOCH] = -1
        for partition, rows in records.groupby("partition"):
            ends = np.array(
                [self.ends[e].get(source, {}).get(str(partition), -1) for e in self.epochs],
                dtype=np.int64,
            )
            if (np.diff(ends) < 0).any():
                back = int(np.argmax(np.diff(ends) < 0))
                raise AssertionError(
                    f"{source} partition {partition}: epoch {epochs[back + 1]} ends at "
                    f"{ends[back + 1]}, before epoch {epochs[back]}'s end {ends[back]}"
                )
            index = np.searchsorted(ends, rows["offset"].to_numpy(), side="right")
            out.loc[rows.index, EPOCH] = np.where(
                index < len(epochs), epochs[np.minimum(index, len(epochs) - 1)], -1
            )
        lost = out[out[EPOCH] < 0]
        if not lost.empty:
            first = lost.sort_values(["partition", "offset"]).iloc[0]
            last = self.epochs[-1] if self.ends else None
            raise AssertionError(
                f"{len(lost):,} records of {source} are in no committed epoch, the first at "
                f"partition {first['partition']} offset {first['offset']} (last committed epoch: "
                f"{last}, ending at {self.ends.get(last, {}).get(source)})"
            )
        return out


def committed_cuts(table: Path | str) -> EpochCuts:
    """The epoch cuts an exactly-once sink table's commits recorded (since its last reset).
    Fails if an epoch is recorded twice with different ends, or if the committed epochs have a
    gap (output of the missing epochs could never be checked)."""
    ends: dict[int, Positions] = {}
    times: dict[int, int] = {}
    for entry in sorted(open_table(table).history(), key=lambda h: h["version"]):
        if entry.get("operation") == "DELETE":  # a start-over's reset: the input is read again
            ends, times = {}, {}
        info = json.loads(entry["cutline"]) if entry.get("cutline") else {}
        for epoch, ms in info.get("times", {}).items():
            if times.setdefault(int(epoch), ms) != ms:
                raise AssertionError(f"{table}: epoch {epoch} committed twice, at two times")
        for epoch, where in info.get("epochs", {}).items():
            if int(epoch) in ends and ends[int(epoch)] != where:
                raise AssertionError(
                    f"{table}: epoch {epoch} committed twice, ending at {ends[int(epoch)]} and at "
                    f"{where} (version {entry['version']})"
                )
            ends[int(epoch)] = where
    return EpochCuts(ends, times).contiguous(str(table))


def output(table: Path | str) -> pd.DataFrame:
    """A sink table's rows, strictly: a table that cannot be read fails the check."""
    return read_delta(table).to_pandas()


def watermarks(
    records: pd.DataFrame,
    epochs: list[int],
    lag_ms: int,
    times: dict[int, int] | None = None,
    idle_ms: int | None = None,
) -> pd.Series:
    """The watermark each epoch's micro-batch runs with (NaN before the first record), Flink's
    rule folded after each epoch: per input ``partition`` (one if ``records`` has none), the
    largest event time ``ts`` so far; a partition is idle once ``idle_ms`` passed, by the
    epochs' planned processing ``times``, since the last epoch with records of it; the
    watermark is the minimum over the seen, non-idle partitions less ``lag_ms``, holds while
    all are idle, and never goes back. Without ``times`` or ``idle_ms`` none goes idle."""
    part = records["partition"] if "partition" in records else pd.Series(0, index=records.index)
    high = (
        records.assign(_p=part)
        .pivot_table(index=EPOCH, columns="_p", values="ts", aggfunc="max")
        .reindex(epochs)
    )
    top = high.cummax().ffill()  # per partition: the largest event time through each epoch
    active = top.notna()
    if times is not None and idle_ms is not None:
        clock = pd.Series([times[e] for e in epochs], index=epochs, dtype="float64")
        stamp = pd.DataFrame({c: clock for c in high.columns}).where(high.notna())
        active &= stamp.ffill().rsub(clock, axis=0) < idle_ms
    after = top.where(active).min(axis=1) - lag_ms  # NaN: nothing seen, or every one idle
    return after.cummax().ffill().shift(1).rename("watermark")


def first_epoch_at_least(marks: pd.Series, times: pd.Series) -> pd.Series:
    """For each of ``times``, the first epoch whose watermark (``marks``, indexed by epoch) is
    at least it: when an event-time timer at that time fires. ``-1``: none yet."""
    epochs = marks.index.to_numpy()
    levels = marks.fillna(-np.inf).cummax().to_numpy()
    index = np.searchsorted(levels, times.to_numpy(), side="left")
    return pd.Series(
        np.where(index < len(epochs), epochs[np.minimum(index, len(epochs) - 1)], -1),
        index=times.index,
    )
