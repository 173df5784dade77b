"""Safe evolution: which checkpoints a changed job may restore (Flink's operator uids).

Every stateful stage has a uid (default: its name) and a state schema: each state's fingerprint
names its kind, type and stored form (state/user_state.py; the built-in operators name their own
forms). Each manifest records both (``stages``), and the subtasks' state handles are filed under
the uid. A restore takes a checkpoint only if

- every uid the checkpoint holds state for is a stage of the job: a stage that was removed (or
  whose uid changed) is refused, unless the user passes ``--allow-non-restored-state`` (its state
  is then dropped, as in Flink);
- every state both sides know has the same fingerprint: a changed type is refused, naming the
  stage and the state.

A stage the checkpoint does not know starts empty; a state the job no longer declares is dropped.
Renaming a stage and keeping its uid restores its state.
"""

from __future__ import annotations

from spark_jobs.errors import IncompatibleStateError
from spark_jobs.job import JobDefinition
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
            f"checkpoint {manifest.checkpoint_id} of {job.name} holds the state of stage uid "
            f"{uid!r}"
        )
        if not allow_non_restored:
            known = ", ".join(f"{s.name!r} (uid {s.uid!r})" for s in job.stages)
            raise IncompatibleStateError(
                f"{what}, which the job has no stage for (its stages: {known}): keep the uid to "
                "restore it, or pass --allow-non-restored-state to drop that state"
            )
        log(f"{what}, which the job has no stage for: dropped (--allow-non-restored-state)")
    for stage in job.stages:
        _check_states(stage, manifest, log)


def _check_states(stage, manifest: CheckpointManifest, log) -> None:
    """Every state of ``stage`` that the checkpoint also knows is stored the same way."""
    before = manifest.stages.get(stage.uid)
    if before is None:
        return  # a new stage, or a checkpoint from before fingerprints were recorded
    now = stage.state_schema()
    for name in sorted(before.keys() & now.keys()):
        if before[name] != now[name]:
            raise IncompatibleStateError(
                f"stage {stage.name!r} (uid {stage.uid!r}): state {name!r} was stored as "
                f"{before[name]} in checkpoint {manifest.checkpoint_id} but is declared as "
                f"{now[name]}: a changed state type cannot be restored (give the state a new "
                "name to start it empty)"
            )
    for name in sorted(before.keys() - now.keys()):
        log(f"stage {stage.name!r}: state {name!r} is no longer declared: dropped")
