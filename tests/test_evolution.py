"""Which checkpoints a changed job may restore (spark_jobs/driver/evolution.py), by stage uid and
state
fingerprint: nothing a checkpoint holds is dropped without --allow-non-restored-state."""

from __future__ import annotations

import dataclasses

import pytest
from cutline_examples.jobs import clicks_per_user
from cutline_sessions.jobs import sessions

from cutline.operators import KeyedAggregate
from spark_jobs.driver.evolution import check_restorable, checkpoint_parallelism
from spark_jobs.errors import IncompatibleStateError, exit_code
from state.handles import SubtaskStateHandle
from state.keygroups import key_group_range
from state.manifest import CheckpointManifest


def checkpoint_of(job, stages: dict[str, dict[str, str]] | None = None) -> CheckpointManifest:
    """A checkpoint of ``job`` (or of the stages given) as its manifest records them."""
    recorded = stages if stages is not None else {s.uid: s.state_schema() for s in job.stages}
    return CheckpointManifest(job.name, 7, 12, 1, 0, {}, (), stages=recorded)


def refused(job, manifest, match: str) -> None:
    with pytest.raises(IncompatibleStateError, match=match):
        check_restorable(job, manifest, log=lambda _: None)


def test_the_same_job_and_a_renamed_stage_with_its_uid_restore():
    job = sessions()
    check_restorable(job, checkpoint_of(job))
    renamed = dataclasses.replace(job.operator, name="by_gap", uid=job.operator.uid)
    check_restorable(dataclasses.replace(job, operator=renamed), checkpoint_of(job))


def test_a_removed_stage_is_refused_unless_non_restored_state_is_allowed():
    job = sessions()
    other = dataclasses.replace(job.operator, name="v2", uid="v2")
    changed = dataclasses.replace(job, operator=other)
    refused(changed, checkpoint_of(job), "holds the state of stage uid 'sessionize'")
    dropped: list[str] = []
    check_restorable(changed, checkpoint_of(job), allow_non_restored=True, log=dropped.append)
    assert dropped and "dropped" in dropped[0]


def test_a_removed_or_renamed_state_is_refused_unless_allowed():
    """A state the stage no longer declares would start over silently: refused, naming it."""
    job = clicks_per_user()
    old = {job.operator.uid: {"count_by_user": "keyed-aggregate<clicks=count()>/v1"}}
    refused(job, checkpoint_of(job, old), "state 'count_by_user' .* no longer declares")
    check_restorable(job, checkpoint_of(job, old), allow_non_restored=True, log=lambda _: None)


def test_a_changed_state_layout_is_refused_naming_the_stage_and_the_state():
    job = clicks_per_user()
    more = KeyedAggregate(
        "count_by_user", "clicks", "user", "string", {"clicks": ("count", None)}
    )  # last_ts dropped: the packed aggregates change layout
    changed = dataclasses.replace(job, operator=more)
    refused(changed, checkpoint_of(job), r"stage 'count_by_user' .*state 'aggregates' was stored")
    with pytest.raises(IncompatibleStateError):  # the flag drops stages and states, not types
        check_restorable(changed, checkpoint_of(job), allow_non_restored=True)


def test_a_stage_keyed_differently_is_refused():
    """State filed under one key cannot be read under another (a column added to the key)."""
    job = clicks_per_user()
    by_pair = KeyedAggregate(
        "count_by_user",
        "clicks",
        ("user", "url"),
        ("string", "string"),
        {"clicks": ("count", None), "last_ts": ("max", "ts")},
    )
    changed = dataclasses.replace(job, operator=by_pair)
    refused(changed, checkpoint_of(job), r"keyed by key<string> .* is keyed by key<string,string>")


def test_a_checkpoint_at_another_parallelism_is_rescaled_and_another_max_parallelism_refused():
    """Another parallelism restores (rescaled, state/rescale.py); another max parallelism, or a
    layout with a subtask missing, is refused before anything runs (exit 2), not retried."""
    job = clicks_per_user()  # parallelism 2
    uid = job.stages[0].uid

    def at(parallelism: int, max_parallelism: int = job.max_parallelism) -> CheckpointManifest:
        handles = tuple(
            SubtaskStateHandle(uid, i, key_group_range(i, parallelism, max_parallelism), 4, ())
            for i in range(parallelism)
        )
        return dataclasses.replace(checkpoint_of(job), subtasks=handles)

    for parallelism in (1, 2, 3, job.max_parallelism):
        check_restorable(job, at(parallelism))
        assert checkpoint_parallelism(job, at(parallelism)) == parallelism
    refused(job, at(2, 64), rf"max_parallelism 64, but the job has {job.max_parallelism}")
    partial = at(3)
    partial = dataclasses.replace(partial, subtasks=partial.subtasks[::2])  # subtask 1 missing
    refused(job, partial, r"stage uid 'count_by_user' is not a whole layout of 3 subtasks")
    assert exit_code(IncompatibleStateError("x")) == 2
