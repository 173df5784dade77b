"""Stages that read past the stage before them: a third stage reads the first stage's output,
carried through the second (``Forwarded`` chunks, spark_jobs/executor/dataflow.py), and the
second. Through Spark, its output is compared epoch by epoch with pandas (tests/reference.py);
in the harness, with the same answer per micro-batch. (A later stage reading a source is
``profiled_clicks``, killed at random in tests/test_exactly_once.py.)"""

from __future__ import annotations

import pandas as pd
import pytest

from cutline.testing import Harness
from spark_jobs.sources.generate import generate
from tests.chain_jobs import skip_chain
from tests.e2e_util import report, run_to_end
from tests.reference import check, read_log


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.landing
def test_a_stage_reading_an_earlier_stage_past_the_next_gets_its_output_in_the_same_batch(
    tmp_path,
):
    home = tmp_path / "home"
    generate(home / "log", "clicks", "clicks", count=8_000, seed=7, users=500)
    run = ["--until-caught-up", "--interval-ms", "1000", "--max-records-per-partition", "2000"]
    run_to_end(home, "run", "tests.chain_jobs:skip_chain", *run)
    report(f"skip_chain: output == reference ({check('skip_chain', home)})")


def test_the_harness_routes_a_stage_output_past_the_next_stage(tmp_path):
    generate(tmp_path / "log", "clicks", "clicks", count=300, seed=7, users=20)
    clicks = read_log(tmp_path, "clicks")[["user", "url", "ts"]]
    batches = [clicks.iloc[i : i + 100] for i in range(0, len(clicks), 100)]
    with Harness(skip_chain()) as h:
        for n, batch in enumerate(batches, start=1):
            out = h.process(batch).to_pandas().set_index("user").sort_index()
            seen = pd.concat(batches[:n])
            expected_clicks = seen.groupby("user").size()
            expected_updates = pd.concat([b.drop_duplicates("user") for b in batches[:n]])
            expected_updates = expected_updates.groupby("user").size()
            users = sorted(batch["user"].unique())
            assert out.index.tolist() == users
            assert out["clicks"].tolist() == expected_clicks[users].tolist()
            assert out["updates"].tolist() == expected_updates[users].tolist()
