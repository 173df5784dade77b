"""Errors raised inside Spark tasks that a restart cannot fix reach the driver typed
(spark_jobs/errors.py): the marker round trip, the classification of a failure's text, and the
restore task's key-group check (spark_jobs/executor/subtask.py)."""

from __future__ import annotations

import dataclasses

import pytest
from cutline_examples.jobs import clicks_per_user

from cutline.keyed_process import UserFunctionError
from spark_jobs.driver.run_state import RunState
from spark_jobs.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    BadRecordError,
    IncompatibleStateError,
    NonRetryableError,
    TaskError,
    carry_to_driver,
    exit_code,
    mark_task_error,
    task_error,
)
from spark_jobs.executor.subtask import RunContext, prepare_slot, prepare_subtask
from state.handles import SubtaskStateHandle
from state.keygroups import key_group_range


def spark_report(task_text: str) -> str:
    """How Spark reports a Python task's failure: its own lines around the worker's
    traceback, the JVM's stack after it."""
    return (
        "PythonException: \n  An exception was thrown from the Python worker. Please see the "
        'stack trace below.\nTraceback (most recent call last):\n  File "x.py", line 1\n'
        f"spark_jobs.errors.TaskError: {task_text}\n\n\tat org.apache.spark.api.python.Foo\n"
        "JVM stacktrace:\norg.apache.spark.SparkException: Job aborted"
    )


def test_a_marked_error_comes_back_as_its_class_with_its_clean_message():
    message = "checkpoint 4 holds key groups [0, 63]\nfor subtask 0"
    error = task_error(spark_report(mark_task_error(IncompatibleStateError(message))))
    assert type(error) is IncompatibleStateError and str(error) == message
    assert exit_code(error) == EXIT_BAD_INPUT
    user = task_error(spark_report(mark_task_error(UserFunctionError("stage 's' raised"))))
    assert type(user) is UserFunctionError and exit_code(user) == EXIT_BAD_INPUT


def test_an_unknown_class_is_still_not_retryable_and_unmarked_text_is_nothing():
    text = mark_task_error(BadRecordError("bad")).replace("BadRecordError", "GoneError")
    error = task_error(spark_report(text))
    assert type(error) is NonRetryableError and str(error) == "bad"
    assert task_error(spark_report("RuntimeError: executor lost")) is None


def test_only_non_retryable_errors_leave_a_task_marked():
    with pytest.raises(TaskError) as marked, carry_to_driver():
        raise IncompatibleStateError("no")
    assert isinstance(task_error(str(marked.value)), IncompatibleStateError)
    assert exit_code(marked.value) == EXIT_FAILED  # unclassified, it would be retried
    with pytest.raises(OSError), carry_to_driver():
        raise OSError("disk full")  # retryable: passes unchanged


def test_a_failure_whose_text_is_marked_stands_typed_and_a_typed_one_unchanged():
    state = RunState()
    cause = RuntimeError(spark_report(mark_task_error(IncompatibleStateError("kg"))))
    state.fail(f"Py4JJavaError: {cause}", cause)
    assert isinstance(state.error, IncompatibleStateError) and state.failure == "kg"
    assert state.error.__cause__ is cause
    state.fail("later", ValueError("later"))  # the first failure stands
    assert state.failure == "kg"
    typed = RunState()
    typed.fail("bad record", BadRecordError("bad record"))
    assert isinstance(typed.error, BadRecordError) and typed.failure == "bad record"


def test_state_that_does_not_cover_a_subtasks_key_groups_fails_its_task_as_not_retryable(
    tmp_path,
):
    """Subtask 0 at parallelism 1 owns every key group; half a layout of 2 cannot rebuild it."""
    job = dataclasses.replace(clicks_per_user(), parallelism=1)
    ctx = RunContext(job, 2, str(tmp_path / "chk"), str(tmp_path / "local"), str(tmp_path))
    uid = job.stages[0].uid
    handle = SubtaskStateHandle(uid, 0, key_group_range(0, 2, job.max_parallelism), 4, ())
    with pytest.raises(IncompatibleStateError, match=r"key groups 64\.\.127 are in no old subtask"):
        prepare_subtask(ctx, uid, 0, (handle,), 0)
    with pytest.raises(TaskError) as failed:  # as the restore's Spark task fails
        prepare_slot(ctx, 0, {uid: (handle,)}, 0)
    state = RunState()
    state.fail(f"PythonException: {spark_report(str(failed.value))}")
    assert isinstance(state.error, IncompatibleStateError)
    assert state.failure.startswith("checkpoint 4, stage 'count_by_user', subtask 0")
    assert "parallelism 1" in state.failure and "\n" not in state.failure
