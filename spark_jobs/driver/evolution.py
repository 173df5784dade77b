"""Safe evolution: which checkpoints a changed job may restore (Flink's operator uids).

Every stateful stage has a uid (default: its name) and a state schema: each state's fingerprint
names its kind, type and stored form (state/state_types.py; a function that packs its own bytes
names the layout in ``StateSpec.encoding``). Each manifest records both (``stages``), and the
subtasks' state handles are filed under the uid. A restore takes a checkpoint only if

- every uid the checkpoint holds state for is a stage of the job, and every state it holds for
  a stage is one the stage still declares: a removed stage (or a changed uid) and a removed (or
  renamed) state are refused, naming them, unless the user passes
  ``--allow-non-restored-state`` (that state is then dropped, as in Flink);
- every state both sides know has the same fingerprint: a changed type is refused, naming the
  stage and the state;
- the checkpoint was taken at the job's max parallelism (its key groups are the job's), and holds
  each stage's whole key-group layout at some parallelism; at another parallelism than the job's
  the state is rescaled on restore (state/rescale.py). Anything else is refused before anything
  runs, naming both.

A stage or a state the checkpoint does not know starts empty. Renaming a stage and keeping its
uid restores its state. Nothing a checkpoint holds is ever dropped without the flag: a restore
never silently starts a state over.
"""

from __future__ import annotations

from cutline.job import KEY_FINGERPRINT, JobDefinition
from spark_jobs.errors import IncompatibleStateError
from state.keygroups import key_group_range
from state.manifest import CheckpointManifest


def check_restorable(
    job: JobDefinition,
    manifest: CheckpointManifest,
    *,
    allow_non_restored: bool = False,
    log=print,
) -> None:
    """Raise :class:`IncompatibleStateError` unless ``job`` may restore ``manifest``."""
    stages = {s.uid: s for s in job.stages}
    held = {h.operator for h in manifest.subtasks} | set(manifest.stages)
    for uid in sorted(held - stages.keys()):
        what = (
            f"checkpoint {manifest.checkpoint_id} of {manifest.job_id} holds the state of stage "
            f"uid {uid!r}"
        )
        if not allow_non_restored:
            known = ", ".join(f"{s.name!r} (uid {s.uid!r})" for s in job.stages)
            raise IncompatibleStateError(
                f"{what}, which the job has no stage for (its stages: {known}): keep the uid to "
                "restore it, or pass --allow-non-restored-state to drop that state"
            )
        log(f"{what}, which the job has no stage for: dropped (--allow-non-restored-state)")
    checkpoint_parallelism(job, manifest)
    for stage in job.stages:
        _check_states(stage, manifest, allow_non_restored, log)


def checkpoint_parallelism(job: JobDefinition, manifest: CheckpointManifest) -> int | None:
    """The parallelism ``manifest``'s state was taken at (None: it holds no state of the job's
    stages); raises :class:`IncompatibleStateError` unless every stage's state is the job's max
    parallelism cut into a whole layout at that parallelism."""
    stages = {s.uid for s in job.stages}
    held = [h for h in manifest.subtasks if h.operator in stages]
    if not held:
        return None
    parallelism = max(h.subtask for h in held) + 1
    what = f"checkpoint {manifest.checkpoint_id} of {manifest.job_id}"
    for uid in sorted({h.operator for h in held}):
        ranges = sorted((h.subtask, h.key_group_range) for h in held if h.operator == uid)
        if ranges == _layout(parallelism, job.max_parallelism):
            continue
        found = max(r.end for _, r in ranges) + 1
        if found != job.max_parallelism and ranges == _layout(parallelism, found):
            raise IncompatibleStateError(
                f"{what} was taken with max_parallelism {found}, but the job has "
                f"{job.max_parallelism}: its key groups cannot be cut again (restore it with "
                f"max_parallelism={found} in the job definition)"
            )
        raise IncompatibleStateError(
            f"{what}: the state of stage uid {uid!r} is not a whole layout of {parallelism} "
            f"subtasks of max_parallelism {job.max_parallelism} (its subtasks and key groups: "
            f"{[(i, r.to_list()) for i, r in ranges]})"
        )
    return parallelism


def _layout(parallelism: int, max_parallelism: int) -> list:
    return [(i, key_group_range(i, parallelism, max_parallelism)) for i in range(parallelism)]


def _check_states(stage, manifest: CheckpointManifest, allow_non_restored: bool, log) -> None:
    """Every state of ``stage`` that the checkpoint also knows is stored the same way."""
    before = manifest.stages.get(stage.uid)
    if before is None:
        return  # a new stage, or a checkpoint from before fingerprints were recorded
    now = stage.state_schema()
    for name in sorted(before.keys() & now.keys()):
        if before[name] != now[name] and name == KEY_FINGERPRINT:
            raise IncompatibleStateError(
                f"stage {stage.name!r} (uid {stage.uid!r}) was keyed by {before[name]} in "
                f"checkpoint {manifest.checkpoint_id} but is keyed by {now[name]}: its state "
                "cannot be restored under other keys (give the stage a new uid, and pass "
                "--allow-non-restored-state to drop the old one)"
            )
        if before[name] != now[name]:
            raise IncompatibleStateError(
                f"stage {stage.name!r} (uid {stage.uid!r}): state {name!r} was stored as "
                f"{before[name]} in checkpoint {manifest.checkpoint_id} but is declared as "
                f"{now[name]}: a changed state type cannot be restored (give the state a new "
                "name, and pass --allow-non-restored-state to drop the old one)"
            )
    for name in sorted(before.keys() - now.keys()):
        what = (
            f"stage {stage.name!r} (uid {stage.uid!r}): checkpoint {manifest.checkpoint_id} holds "
            f"state {name!r} ({before[name]}), which the stage no longer declares"
        )
        if not allow_non_restored:
            raise IncompatibleStateError(
                f"{what} (it declares {sorted(now)}): declare it again to restore it, or pass "
                "--allow-non-restored-state to drop it"
            )
        log(f"{what}: dropped (--allow-non-restored-state)")
