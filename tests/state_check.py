"""What ``cutline state read`` must return for ``country_clicks``' country stage
(examples/sessions), computed from the input by pandas: at a checkpoint whose cut is at source
positions P, the input is the log's records before P; then per country ``clicks`` is the sum of
its users' kept clicks, ``users`` their number, and the map ``latest`` holds each user's count."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from spark_jobs.state_processor import read_state
from tests.e2e_util import completed_checkpoints, run_to_end
from tests.epoch_cuts import output as read_table
from tests.reference import before_cut, kept_clicks, read_log
from tests.row_check import compare_rows

STAGE = "clicks_by_country"


def read_with_the_command(home: Path, job: str, state: str, checkpoint: int) -> pd.DataFrame:
    """``cutline state read`` of the state into a Delta table, read back."""
    out = home / "state-read" / state
    args = ["--stage", STAGE, "--state", state, "--checkpoint", str(checkpoint), "--out", str(out)]
    run_to_end(home, "state", "read", job, *args)
    return read_table(str(out))


def check_country_state(home: Path, job: str, spark) -> str:
    """Fail unless the three states of the latest completed checkpoint are the reference's
    (two read with the command, one with ``spark_jobs.state_processor.read_state`` into
    ``spark``); returns a summary."""
    latest = max(completed_checkpoints(home, "country_clicks"), key=lambda r: r["checkpoint_id"])
    cut = json.loads(latest["source_positions"])["clicks"]
    clicks = read_log(home, "clicks")
    before = before_cut(clicks, cut)
    kept = kept_clicks(before)
    per_user = kept.groupby(["country", "user"]).size().rename("count").reset_index()
    per_country = per_user.groupby("country").agg(clicks=("count", "sum"), users=("user", "size"))
    expected = per_country.reset_index().assign(_epoch=0)
    cid = latest["checkpoint_id"]
    lines = []
    for state in ("clicks", "users"):
        if state == "users":
            got = read_state(spark, job, STAGE, state, cid, home=str(home)).toPandas()
        else:
            got = read_with_the_command(home, job, state, cid)
        got = got.rename(columns={"value": state})
        lines.append(
            compare_rows(got.assign(_epoch=0), expected, ["country"], [state], f"state {state}")
        )
    got = read_with_the_command(home, job, "latest", cid).rename(
        columns={"user_map_key": "user", "user_map_value": "count"}
    )
    want = per_user.assign(_epoch=0)
    lines.append(compare_rows(got.assign(_epoch=0), want, ["country", "user"], ["count"], "latest"))
    return f"checkpoint {cid}: " + "; ".join(lines)
