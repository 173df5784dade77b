"""The fencing tests' witness itself (tests/e2e_util.py ``committed_after_fence``), on Delta
tables written here with delta-rs (no Spark): a checkpoint row or a sink commit of the older
attempt that lands after the newer attempt's fence is found, whatever its timestamps say."""

from __future__ import annotations

import json

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from spark_jobs.catalog.tables import arrow_schema
from tests.e2e_util import catalog_table, committed_after_fence

JOB, SINKS = "job", {"out": "out_table"}


def checkpoint(home, attempt: int, cid: int | None, fence: int) -> None:
    """A commit to completed_checkpoints: a row of ``attempt`` (none if ``cid`` is None) and the
    fence transaction at ``fence``."""
    schema = arrow_schema("completed_checkpoints")
    rows = [] if cid is None else [{"job_id": JOB, "attempt": attempt, "checkpoint_id": cid}]
    data = pa.Table.from_pylist(rows, schema=schema)
    write_deltalake(
        str(catalog_table(home, "completed_checkpoints")),
        data,
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction(f"cutline-{JOB}", fence)]),
    )


def sink_commit(home, attempt: int, fence: int, epoch: int | None) -> None:
    info = {"cutline": json.dumps({"attempt": attempt, "epochs": {str(epoch): {}}})}
    write_deltalake(
        str(home / "warehouse" / "tables" / "out_table"),
        pa.table({"_epoch": pa.array([] if epoch is None else [epoch], pa.int64())}),
        mode="append",
        commit_properties=CommitProperties(
            app_transactions=[Transaction(f"cutline-fence-{JOB}-out", fence)],
            custom_metadata=info if epoch is not None else None,
        ),
    )


def test_late_commits_of_a_fenced_attempt_are_found_in_commit_order(tmp_path):
    home = tmp_path
    checkpoint(home, 1, 1, 1 << 32 | 1)
    sink_commit(home, 1, 1, 0)
    checkpoint(home, 2, None, 2 << 32)  # attempt 2 fences the catalog
    sink_commit(home, 2, 2, None)  # and the sink
    assert committed_after_fence(home, JOB, SINKS, old=1, new=2) == []
    checkpoint(home, 1, 2, 2 << 32)  # what a broken fence would let through
    sink_commit(home, 1, 2, 1)
    assert committed_after_fence(home, JOB, SINKS, old=1, new=2) == [
        2,
        "out version 2: epochs ['1']",
    ]
