"""How an attempt decides what to start from (spark_jobs/driver/attempt_start.py), without Spark:
the in-memory catalog (plus the two reads and one write of the Delta catalog the start uses),
local storage holding hand-built checkpoints, and fake sinks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spark_jobs.catalog.checkpoint_root import check_root, same_root
from spark_jobs.deploy.settings import RuntimePaths
from spark_jobs.driver import attempt_start
from spark_jobs.driver.attempt_start import (
    plan_start,
    recover_sinks,
    refuse_silent_start,
    select_checkpoint,
    start_over,
)
from spark_jobs.errors import ConfigurationError, NoRestorableCheckpointError
from state.catalog import CompletedCheckpoint
from state.config import AT_LEAST_ONCE, EXACTLY_ONCE
from state.handles import StateFile, SubtaskStateHandle
from state.keygroups import KeyGroupRange
from state.manifest import CheckpointManifest
from state.memory_catalog import InMemoryCatalog
from state.paths import JobLayout
from state.storage import LocalFileStorage

JOB = "clicks"
LAYOUT = JobLayout(JOB)


class Catalog(InMemoryCatalog):
    """The in-memory catalog with the Delta catalog's attempt rows: the root each attempt ran
    under (``jobs``), and its end (``set_job_status``); remembers what was marked CORRUPT."""

    def __init__(self) -> None:
        super().__init__()
        self.job_rows: dict[int, dict] = {}
        self.corrupt: list[tuple[int, str]] = []

    def begin_attempt(self, job_id, run_id="", checkpoint_root="", **details) -> int:
        attempt = super().begin_attempt(job_id, run_id)
        self.job_rows[attempt] = {
            "attempt": attempt,
            "checkpoint_root": checkpoint_root,
            "status": "RUNNING",
        }
        return attempt

    def jobs(self, job_id: str) -> list[dict]:
        return [dict(r) for _, r in sorted(self.job_rows.items())]

    def set_job_status(self, job_id, attempt, status, reason="") -> None:
        self.job_rows[attempt].update(status=status, reason=reason)

    def mark_corrupt(self, job_id, checkpoint_id, reason) -> None:
        self.corrupt.append((checkpoint_id, reason))
        super().mark_corrupt(job_id, checkpoint_id, reason)

    def statuses(self) -> dict[int, str]:
        return {r.checkpoint_id: r.status.value for r in self.checkpoints(JOB)}


class FakeSink:
    def __init__(self, name: str = "out", output: int = 0, committed: int = -1) -> None:
        self.sink, self.table_path = name, f"/warehouse/{name}"
        self.output, self.committed = output, committed
        self.calls: list[tuple] = []

    def fence(self) -> None:
        self.calls.append(("fence",))

    def has_output(self) -> bool:
        return self.output > 0

    def committed_epoch(self) -> int:
        return self.committed

    def commit_through(self, epoch, ends, *, staged_by=None, times=None) -> int:
        self.calls.append(("commit", epoch, ends, staged_by, times))
        return 2

    def discard_other_attempts(self) -> None:
        self.calls.append(("discard",))

    def reset(self) -> int:
        rows, self.output = self.output, 0
        self.calls.append(("reset",))
        return rows


class Rig:
    """A job whose checkpoints are written to local storage and committed to the catalog."""

    def __init__(self, tmp_path) -> None:
        self.root = str(tmp_path / "checkpoints")
        self.storage = LocalFileStorage(self.root)
        self.catalog = Catalog()
        self.lines: list[str] = []

    def checkpoint(self, cid: int, *, attempt: int = 1, write: bool = True) -> CheckpointManifest:
        """Checkpoint ``cid`` (batch ``10 * cid``): one shared and one private file, stored,
        its manifest written and its catalog row committed."""
        files = (
            StateFile("000001.sst", f"shared/count/0/000001-t{cid}.sst", 5, "crc32:00000001"),
            StateFile("MANIFEST-1", f"chk-{cid}/count/0/MANIFEST-1", 3, "crc32:00000002"),
        )
        m = CheckpointManifest(
            job_id=JOB,
            checkpoint_id=cid,
            batch_id=10 * cid,
            attempt=attempt,
            trigger_time_ms=1_700_000_000_000 + cid,
            source_positions={"log": {"0": 100 * cid}},
            subtasks=(
                SubtaskStateHandle("count", 0, KeyGroupRange(0, 127), cid, files, uploaded_bytes=8),
            ),
            sink_epochs={"out": 10 * cid},
            epoch_ends={10 * cid: {"log": {"0": 100 * cid}}},
            epoch_times={10 * cid: 7},
        )
        if write:
            for f in files:
                self.storage.put_bytes(LAYOUT.job_path(f.path), b"x" * f.size)
            self.storage.put_bytes(LAYOUT.job_path(LAYOUT.metadata(cid)), m.to_json())
        self.catalog.attempts[JOB] = max(self.catalog.attempts.get(JOB, 0), attempt)
        self.catalog.job_rows.setdefault(
            attempt, {"attempt": attempt, "checkpoint_root": self.root, "status": "FAILED"}
        )
        self.catalog.commit_checkpoint(CompletedCheckpoint.from_manifest(m, 1))
        return m

    def select(self, wanted="latest", **kw):
        return select_checkpoint(self.catalog, self.storage, JOB, wanted, self.lines.append, **kw)

    def path(self, relative: str) -> str:
        return LAYOUT.job_path(relative)


# -- select_checkpoint ---------------------------------------------------------------------------


def test_the_latest_completed_checkpoint_that_validates_is_chosen(tmp_path):
    rig = Rig(tmp_path)
    rig.checkpoint(1)
    latest = rig.checkpoint(2)
    manifest, fallbacks = rig.select()
    assert manifest == latest and fallbacks == []
    assert rig.catalog.corrupt == []


def test_a_subsumed_checkpoint_is_not_latest(tmp_path):
    rig = Rig(tmp_path)
    first = rig.checkpoint(1)
    rig.checkpoint(2)
    rig.catalog.mark_subsumed(JOB, [2])
    assert rig.select() == (first, [])


def test_a_missing_manifest_is_skipped_and_not_marked_corrupt(tmp_path):
    rig = Rig(tmp_path)
    first = rig.checkpoint(1)
    rig.checkpoint(2)
    rig.storage.delete(rig.path(LAYOUT.metadata(2)))
    manifest, fallbacks = rig.select()
    assert manifest == first
    assert fallbacks == ["checkpoint 2: its manifest is missing"]
    assert rig.catalog.corrupt == []
    assert rig.catalog.statuses() == {1: "COMPLETED", 2: "COMPLETED"}


@pytest.mark.parametrize(
    "damage, evidence",
    [
        (lambda rig: rig.storage.delete(rig.path("shared/count/0/000001-t2.sst")), "missing"),
        (
            lambda rig: rig.storage.put_bytes(rig.path("chk-2/count/0/MANIFEST-1"), b"xxxxxx"),
            "size 6 != 3",
        ),
        (
            lambda rig: rig.storage.put_bytes(rig.path(LAYOUT.metadata(2)), b"{not json"),
            "_metadata",
        ),
    ],
    ids=["missing-file", "wrong-size", "unreadable-manifest"],
)
def test_positive_evidence_marks_corrupt_and_falls_back(tmp_path, damage, evidence):
    rig = Rig(tmp_path)
    first = rig.checkpoint(1)
    rig.checkpoint(2)
    damage(rig)
    manifest, fallbacks = rig.select()
    assert manifest == first
    [(cid, reason)] = rig.catalog.corrupt
    assert cid == 2 and evidence in reason
    assert fallbacks == [f"checkpoint 2: {reason}"]
    assert rig.catalog.statuses() == {1: "COMPLETED", 2: "CORRUPT"}
    assert any("marking it CORRUPT" in line for line in rig.lines)
    assert rig.select() == (first, []), "a CORRUPT checkpoint is no longer a candidate"


def test_below_limits_the_candidates(tmp_path):
    rig = Rig(tmp_path)
    first = rig.checkpoint(1)
    rig.checkpoint(2)
    rig.checkpoint(3)
    assert rig.select(below=2) == (first, [])
    assert rig.select(below=1) == (None, [])


def test_nothing_restorable_returns_none_with_every_reason(tmp_path):
    rig = Rig(tmp_path)
    rig.checkpoint(1)
    rig.checkpoint(2)
    rig.storage.delete(rig.path(LAYOUT.metadata(1)))
    rig.storage.delete(rig.path("chk-2/count/0/MANIFEST-1"))
    manifest, fallbacks = rig.select()
    assert manifest is None
    assert len(fallbacks) == 2
    assert fallbacks[0].startswith("checkpoint 2: missing ")
    assert fallbacks[1] == "checkpoint 1: its manifest is missing"
    assert [cid for cid, _ in rig.catalog.corrupt] == [2]


def test_restore_by_id_takes_a_subsumed_checkpoint(tmp_path):
    rig = Rig(tmp_path)
    first = rig.checkpoint(1)
    rig.checkpoint(2)
    rig.catalog.mark_subsumed(JOB, [1])
    assert rig.select(1) == (first, [])
    assert rig.select("1") == (first, []), "the id as the command line gives it"


def test_restore_by_id_of_an_unknown_checkpoint_fails(tmp_path):
    rig = Rig(tmp_path)
    rig.checkpoint(1)
    with pytest.raises(NoRestorableCheckpointError, match="has no checkpoint 7"):
        rig.select(7)


def test_restore_by_id_never_falls_back_to_another(tmp_path):
    rig = Rig(tmp_path)
    rig.checkpoint(1)
    rig.checkpoint(2)
    rig.storage.delete(rig.path("shared/count/0/000001-t2.sst"))
    with pytest.raises(NoRestorableCheckpointError, match=r"checkpoint 2 of clicks: .*missing"):
        rig.select(2)
    assert [cid for cid, _ in rig.catalog.corrupt] == [2]
    rig.storage.delete(rig.path(LAYOUT.metadata(1)))
    with pytest.raises(NoRestorableCheckpointError, match="its manifest is missing"):
        rig.select(1)
    assert rig.catalog.statuses()[1] == "COMPLETED"


# -- check_root ----------------------------------------------------------------------------------


def test_the_root_is_accepted_when_it_holds_the_checkpoints(tmp_path):
    rig = Rig(tmp_path)
    check_root(rig.catalog, rig.storage, JOB, rig.root)  # no checkpoints yet: nothing to check
    rig.checkpoint(1)
    check_root(rig.catalog, rig.storage, JOB, rig.root)
    check_root(rig.catalog, rig.storage, JOB, rig.root + "/../checkpoints")


def test_a_root_other_than_the_recorded_one_is_refused(tmp_path):
    rig = Rig(tmp_path)
    rig.checkpoint(1)
    with pytest.raises(ConfigurationError, match="was written under the checkpoint root"):
        check_root(rig.catalog, rig.storage, JOB, str(tmp_path / "elsewhere"))


def test_a_root_holding_none_of_the_manifests_is_refused(tmp_path):
    rig = Rig(tmp_path)
    rig.checkpoint(1)
    rig.checkpoint(2)
    rig.catalog.job_rows[1]["checkpoint_root"] = ""  # an attempt that recorded no root
    empty = LocalFileStorage(str(tmp_path / "empty"))
    with pytest.raises(ConfigurationError, match=r"holds none of the manifests .* \[1, 2\]"):
        check_root(rig.catalog, empty, JOB, str(tmp_path / "empty"))


def testsame_root():
    assert same_root("/a/b/", "/a/b")
    assert same_root("/a/x/../b", "/a/b")
    assert same_root("s3://bucket/root/", "s3://bucket/root")
    assert not same_root("s3://bucket/root", "s3://bucket/other")
    assert not same_root("/a/b", "/a/c")


# -- refuse_silent_start and start_over ----------------------------------------------------------


def test_a_new_job_may_start_empty(tmp_path):
    refuse_silent_start(Catalog(), JOB, FakeSink(), [])


def test_a_job_with_progress_and_nothing_restorable_fails(tmp_path):
    rig = Rig(tmp_path)
    rig.checkpoint(1)
    rig.checkpoint(2)
    rig.catalog.mark_subsumed(JOB, [1])
    rig.catalog.mark_corrupt(JOB, 2, "test")
    with pytest.raises(NoRestorableCheckpointError, match=r"has checkpoints \[2\] but none") as e:
        refuse_silent_start(rig.catalog, JOB, FakeSink(), [])
    assert "all are marked CORRUPT" in str(e.value) and "--restore none" in str(e.value)
    rig.catalog.mark_subsumed(JOB, [2])
    refuse_silent_start(rig.catalog, JOB, FakeSink(), [])  # only SUBSUMED: a retired history


def test_the_reasons_are_given_when_nothing_restorable(tmp_path):
    rig = Rig(tmp_path)
    rig.checkpoint(1)
    with pytest.raises(NoRestorableCheckpointError, match="none can be restored \\(a \\| b\\)"):
        refuse_silent_start(rig.catalog, JOB, FakeSink(), ["a", "b"])


def test_output_without_checkpoints_fails(tmp_path):
    with pytest.raises(NoRestorableCheckpointError, match="has output but the catalog has no"):
        refuse_silent_start(Catalog(), JOB, FakeSink(output=3), [])


def job(mode: str = EXACTLY_ONCE) -> SimpleNamespace:
    return SimpleNamespace(name=JOB, checkpoint=SimpleNamespace(mode=mode), stages=[])


def test_a_start_over_refuses_to_append_to_output(tmp_path):
    rig = Rig(tmp_path)
    rig.checkpoint(1)
    sinks = [FakeSink("out", output=4), FakeSink("dead", output=0)]
    with pytest.raises(ConfigurationError, match="pass --reset-sink"):
        start_over(rig.catalog, job(), sinks, False, rig.lines.append)
    assert sinks[0].output == 4 and rig.catalog.statuses() == {1: "COMPLETED"}


def test_a_start_over_resets_the_output_and_retires_the_checkpoints(tmp_path):
    rig = Rig(tmp_path)
    rig.checkpoint(1)
    rig.checkpoint(2)
    rig.catalog.mark_corrupt(JOB, 1, "test")
    sinks = [FakeSink("out", output=4), FakeSink("dead", output=0)]
    start_over(rig.catalog, job(), sinks, True, rig.lines.append)
    assert sinks[0].calls == [("reset",)] and sinks[1].calls == []
    assert rig.catalog.statuses() == {1: "CORRUPT", 2: "SUBSUMED"}
    assert rig.lines == [
        "sink out: start-over deletes 4 rows of /warehouse/out",
        "start-over: checkpoints [2] retired",
    ]


# -- recover_sinks -------------------------------------------------------------------------------


def test_exactly_once_redoes_the_checkpoints_sink_commit(tmp_path):
    m = Rig(tmp_path).checkpoint(3, attempt=2)
    out, dead, lines = FakeSink("out"), FakeSink("dead"), []
    recover_sinks(job(), [out, dead], m, lines.append)
    assert out.calls == [("commit", 30, {30: {"log": {"0": 300}}}, 2, {30: 7}), ("discard",)]
    # a sink the checkpoint names no epoch of commits through the checkpoint's batch
    assert dead.calls == [("commit", 30, {30: {"log": {"0": 300}}}, 2, {30: 7}), ("discard",)]
    assert lines[0] == "sink out: epoch 30 commit redone (2 rows were missing)"


def test_at_least_once_or_an_empty_start_only_discards(tmp_path):
    m = Rig(tmp_path).checkpoint(3)
    for mode, manifest in ((AT_LEAST_ONCE, m), (EXACTLY_ONCE, None)):
        sink = FakeSink()
        recover_sinks(job(mode), [sink], manifest, print)
        assert sink.calls == [("discard",)]


# -- plan_start: the steps together --------------------------------------------------------------


@pytest.fixture
def planned(tmp_path, monkeypatch):
    """plan_start with fake sinks and no stage checks; returns (rig, sinks, paths, checked)."""
    rig = Rig(tmp_path)
    sinks = [FakeSink("out", committed=20), FakeSink("dead", committed=-1)]
    checked: list[int] = []
    monkeypatch.setattr(attempt_start, "sink_writers", lambda job, paths, attempt: sinks)
    monkeypatch.setattr(
        attempt_start,
        "check_restorable",
        lambda job, manifest, **kw: checked.append(manifest.checkpoint_id),
    )
    paths = RuntimePaths(rig.root, str(tmp_path / "wh"), str(tmp_path / "ls"), str(tmp_path))
    return rig, sinks, paths, checked


def test_plan_start_restores_the_latest(planned):
    rig, sinks, paths, checked = planned
    rig.checkpoint(1)
    latest = rig.checkpoint(2)
    plan = plan_start(rig.catalog, rig.storage, job(), paths, "latest", log=rig.lines.append)
    assert (plan.attempt, plan.manifest, plan.fallbacks) == (2, latest, [])
    assert plan.committed_epoch == 20 and checked == [2]
    assert sinks[0].calls[0] == ("fence",) and sinks[0].calls[-1] == ("discard",)
    assert rig.catalog.job_rows[2]["status"] == "RUNNING"
    assert rig.catalog.job_rows[2]["checkpoint_root"] == rig.root


def test_plan_start_on_a_wrong_root_fails_the_attempt_and_marks_nothing(planned, tmp_path):
    rig, sinks, paths, checked = planned
    rig.checkpoint(1)
    rig.storage.delete(rig.path("shared/count/0/000001-t1.sst"))  # evidence, were it looked at
    wrong = RuntimePaths(str(tmp_path / "elsewhere"), paths.warehouse, "", "")
    with pytest.raises(ConfigurationError):
        plan_start(rig.catalog, rig.storage, job(), wrong, "latest", log=rig.lines.append)
    assert rig.catalog.corrupt == [] and rig.catalog.statuses() == {1: "COMPLETED"}
    row = rig.catalog.job_rows[2]
    assert row["status"] == "FAILED" and row["reason"].startswith("ConfigurationError: ")
    assert checked == [] and all(("discard",) not in s.calls for s in sinks)


def test_plan_start_with_progress_and_nothing_restorable_fails(planned):
    rig, _, paths, checked = planned
    rig.checkpoint(1)
    rig.storage.delete(rig.path("chk-1/count/0/MANIFEST-1"))
    with pytest.raises(NoRestorableCheckpointError, match=r"has checkpoints \[1\] but none"):
        plan_start(rig.catalog, rig.storage, job(), paths, "latest", log=rig.lines.append)
    assert rig.catalog.statuses() == {1: "CORRUPT"}
    assert rig.catalog.job_rows[2]["status"] == "FAILED" and checked == []


def test_a_refused_start_keeps_its_own_error_when_marking_the_attempt_fails(planned, monkeypatch):
    """The catalog write that marks a refused attempt FAILED may fail too; the refusal (exit 2)
    is still what the start raises, not the catalog's error (which would be retried)."""
    rig, _, paths, _ = planned
    rig.checkpoint(1)
    rig.storage.delete(rig.path("chk-1/count/0/MANIFEST-1"))

    def unreachable(*args, **kwargs):
        raise OSError("catalog unreachable")

    monkeypatch.setattr(rig.catalog, "set_job_status", unreachable)
    with pytest.raises(NoRestorableCheckpointError, match=r"has checkpoints \[1\] but none"):
        plan_start(rig.catalog, rig.storage, job(), paths, "latest", log=rig.lines.append)
    assert rig.lines[-1] == "attempt 2 not marked FAILED: OSError: catalog unreachable"


def test_plan_start_over(planned):
    rig, sinks, paths, checked = planned
    rig.checkpoint(1)
    plan = plan_start(rig.catalog, rig.storage, job(), paths, None, log=rig.lines.append)
    assert plan.manifest is None and plan.attempt == 2
    assert rig.catalog.statuses() == {1: "SUBSUMED"} and checked == []
    assert [c for c in sinks[0].calls if c[0] == "commit"] == []
