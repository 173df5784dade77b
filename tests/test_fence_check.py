"""The fenced-commit check of the kill matrix (tests/fence_check.py) passes a catalog and a sink
whose commits respect their fences, with status rewrites of older attempts' rows among them, and
names the version and attempt of a commit that landed below a fence."""

from __future__ import annotations

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from cutline.sinks.delta import DeltaSinkWriter
from spark_jobs.catalog.delta_catalog import DeltaCatalog
from spark_jobs.catalog.upkeep import compact_checkpoints
from state.storage.tables import table_uri
from tests.fence_check import fenced_checkpoint_commits, fenced_sink_commits
from tests.test_delta_catalog import row


def test_checkpoint_commits_below_a_fence_are_named(tmp_path):
    root = str(tmp_path / "catalog")
    catalog = DeltaCatalog(root)
    first = catalog.begin_attempt("clicks")
    catalog.commit_checkpoint(row(1, first))
    catalog.begin_attempt("other")  # another job's fence and rows are not this one's
    catalog.commit_checkpoint(row(1, 1, job_id="other"))
    second = catalog.begin_attempt("clicks")
    catalog.commit_checkpoint(row(2, second))
    catalog.mark_subsumed("clicks", [1])  # attempt 1's row rewritten after the fence: allowed
    with catalog.latest("completed_checkpoints") as dt:  # and the rows' compaction too
        compact_checkpoints(catalog, dt, "clicks")
    assert fenced_checkpoint_commits(root, "clicks") == ([], 2)
    catalog.import_checkpoints([row(3, first)])  # unfenced: as a fenced attempt's commit would
    late, checked = fenced_checkpoint_commits(root, "clicks")
    assert checked == 3 and len(late) == 1
    assert "a row of attempt 1 after attempt 2's fence" in late[0], late


def test_sink_commits_below_a_fence_are_named(tmp_path):
    output, staging = str(tmp_path / "tables"), str(tmp_path / "staging")
    first = DeltaSinkWriter("clicks", "out", "clicks_out", output, staging, 1)
    first.fence()
    second = DeltaSinkWriter("clicks", "out", "clicks_out", output, staging, 2)
    second.fence()
    assert fenced_sink_commits(output, "clicks", "out", "clicks_out") == ([], 2)
    # attempt 1 commits past attempt 2's fence, as a commit without the fence's check would
    write_deltalake(
        table_uri(output, "clicks_out"),
        pa.table({"_epoch": pa.array([7], pa.int64())}),
        mode="append",
        commit_properties=CommitProperties(
            app_transactions=[Transaction("cutline-fence-clicks-out", 1)]
        ),
    )
    late, checked = fenced_sink_commits(output, "clicks", "out", "clicks_out")
    assert checked == 3 and late == [
        "sink out version 3: attempt 1 committed after attempt 2's fence"
    ]
