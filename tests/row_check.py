"""Output compared with the reference row by row, at epoch granularity.

:func:`compare_rows` fails on any row the reference does not expect in that epoch, any row it
expects there and the output lacks, any value that differs, and any (key, epoch) emitted more
than once, naming the key, the epoch, what was expected and what came.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tests.epoch_cuts import EPOCH

SHOWN = 5  # examples of each kind of difference in a failure message


def _differs(left: pd.Series, right: pd.Series, approx: bool) -> np.ndarray:
    """Element-wise: the two values differ. Nulls equal each other; numbers compare as numbers,
    within a relative 1e-9 if ``approx`` (sums of floats in another order)."""
    numeric = pd.api.types.is_numeric_dtype
    if numeric(left) and numeric(right):
        a = left.to_numpy(dtype="float64", na_value=np.nan)
        b = right.to_numpy(dtype="float64", na_value=np.nan)
        if approx:
            return ~np.isclose(a, b, rtol=1e-9, atol=0.0, equal_nan=True)
        return ~((a == b) | (np.isnan(a) & np.isnan(b)))
    a = left.astype(object).where(left.notna(), None).to_numpy()
    b = right.astype(object).where(right.notna(), None).to_numpy()
    return np.array([x != y for x, y in zip(a, b, strict=True)], dtype=bool)


def compare_rows(
    got: pd.DataFrame,
    expected: pd.DataFrame,
    keys: list[str],
    values: list[str],
    what: str,
    *,
    approx: tuple[str, ...] = (),
) -> str:
    """Fail unless ``got`` holds exactly the rows of ``expected``: one per (``keys``, epoch),
    with equal ``values`` (those in ``approx`` within a relative 1e-9). Returns a summary."""
    where = [*keys, EPOCH]
    problems: list[str] = []
    twice = got[got.duplicated(where, keep=False)].sort_values([EPOCH, *keys])
    if not twice.empty:
        counts = twice.groupby(where, sort=False).size()
        shown = [
            f"key {_key(k, keys)} epoch {k[-1]}: emitted {n} times"
            for k, n in list(counts.items())[:SHOWN]
        ]
        problems.append(f"{len(counts):,} (key, epoch) emitted more than once: {shown}")
    merged = got.drop_duplicates(where).merge(
        expected, on=where, how="outer", suffixes=("_got", "_expected"), indicator=True
    )
    merged = merged.sort_values([EPOCH, *keys])
    missing = merged[merged["_merge"] == "right_only"]
    extra = merged[merged["_merge"] == "left_only"]
    both = merged[merged["_merge"] == "both"]
    wrong = np.zeros(len(both), bool)
    for c in values:
        wrong |= _differs(both[f"{c}_got"], both[f"{c}_expected"], c in approx)
    wrong_rows = both[wrong]
    exp_cols = [f"{c}_expected" for c in values]
    got_cols = [f"{c}_got" for c in values]
    for label, rows, show in (
        ("expected rows missing", missing, lambda r: f"expected {_vals(r, exp_cols)}, got none"),
        ("rows not expected", extra, lambda r: f"expected none, got {_vals(r, got_cols)}"),
        (
            "rows with wrong values",
            wrong_rows,
            lambda r: f"expected {_vals(r, exp_cols)}, got {_vals(r, got_cols)}",
        ),
    ):
        if rows.empty:
            continue
        epochs = sorted(rows[EPOCH].unique().tolist())
        shown = [
            f"key {_key(tuple(r[k] for k in keys), keys)} epoch {r[EPOCH]}: {show(r)}"
            for _, r in rows.head(SHOWN).iterrows()
        ]
        problems.append(f"{len(rows):,} {label} (epochs {_span(epochs)}): " + "; ".join(shown))
    if problems:
        raise AssertionError(
            f"{what}: output differs from the reference ({len(expected):,} rows expected, "
            f"{len(got):,} emitted):\n  " + "\n  ".join(problems)
        )
    return f"{what}: {len(expected):,} rows in {expected[EPOCH].nunique()} epochs equal"


def _key(values: tuple, keys: list[str]) -> str:
    if len(keys) == 1:
        return repr(values[0])
    return "(" + ", ".join(f"{k}={v!r}" for k, v in zip(keys, values, strict=False)) + ")"


def _vals(row: pd.Series, columns: list[str]) -> str:
    return "{" + ", ".join(f"{c.rsplit('_', 1)[0]}={_py(row[c])!r}" for c in columns) + "}"


def _py(value):
    """A value as plain Python (numpy scalars print as their type otherwise)."""
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
        return None
    return value.item() if hasattr(value, "item") else value


def _span(epochs: list[int]) -> str:
    if len(epochs) > 6:
        return f"{epochs[0]}..{epochs[-1]}, {len(epochs)} epochs"
    return ", ".join(map(str, epochs))
