"""``failure_reason`` a person reads: the driver's clean line for a py4j or Spark trace."""

from __future__ import annotations

from spark_jobs.errors import failure_summary

PROXY_DISK_FULL = """\
micro-batch failed: [STREAM_FAILED] Query [id = 5c1e0f3a-9d2b-4c61-8a77-2f0e9b1d4c3e, runId = \
0b8e2f7c-1a3d-4e5f-9b6a-7c8d9e0f1a2b] terminated with exception: An exception was raised by the \
Python Proxy. Return Message: Traceback (most recent call last):
  File "/work/main/.venv/lib/python3.11/site-packages/py4j/clientserver.py", line 644, in \
_call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/work/main/.venv/lib/python3.11/site-packages/pyspark/sql/utils.py", line 165, in call
    raise e
  File "/work/main/.venv/lib/python3.11/site-packages/pyspark/sql/utils.py", line 162, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
  File "/work/main/spark_jobs/driver/micro_batches.py", line 120, in __call__
    self._run_batch(df, batch_id)
  File "/work/main/state/local_copies.py", line 88, in _write_handle
    path.write_bytes(data)
OSError: [Errno 28] No space left on device: '/data/cutline/local-state/clicks_per_user/\
clicks/0/chk-7/_handle'
 SQLSTATE: XXKST
=== Streaming Query ===
Identifier: [id = 5c1e0f3a-9d2b-4c61-8a77-2f0e9b1d4c3e, runId = 0b8e2f7c-1a3d-4e5f-9b6a-\
7c8d9e0f1a2b]
Current Committed Offsets: {LocalLogSource[clicks]: {"0":1200,"1":1180}}
Current Available Offsets: {LocalLogSource[clicks]: {"0":2400,"1":2390}}

Current State: ACTIVE
Thread State: RUNNABLE
"""

TASK_FAILED = """\
micro-batch failed: [STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: An \
exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/work/main/.venv/lib/python3.11/site-packages/py4j/clientserver.py", line 644, in \
_call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/work/main/.venv/lib/python3.11/site-packages/py4j/protocol.py", line 327, in \
get_return_value
    raise Py4JJavaError(
py4j.protocol.Py4JJavaError: An error occurred while calling o412.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 14.0 failed \
1 times, most recent failure: Lost task 1.0 in stage 14.0 (TID 37) (127.0.0.1 executor driver): \
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/work/main/spark_jobs/executor/subtask.py", line 210, in run_subtask
    result = operator.apply(records, ctx)
  File "/work/main/state/rocksdb_store.py", line 301, in put
    self._db.put(key, value)
rocksdict.RocksDBError: IO error: While appending to file: /data/cutline/local-state/j/op/1/\
db-a3/000042.log: Input/output error

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(\
PythonRunner.scala:624)
\tat org.apache.spark.sql.execution.python.PythonArrowOutput$$anon$1.read(\
PythonArrowOutput.scala:118)

Driver stacktrace:
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2935)
"""

JAVA_ONLY = """\
checkpointing failed: org.apache.spark.SparkException: Exception thrown in awaitResult:
\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:53)
Caused by: java.io.FileNotFoundException: /data/warehouse/catalog/_delta_log (Permission denied)
\tat java.base/java.io.FileOutputStream.open0(Native Method)
"""


def test_a_full_disk_says_which_path_could_not_be_written():
    assert failure_summary(PROXY_DISK_FULL) == (
        "micro-batch failed: disk full: no space left on device writing "
        "/data/cutline/local-state/clicks_per_user/clicks/0/chk-7/_handle "
        "(at state/local_copies.py:88 in _write_handle)"
    )


def test_rocksdb_saying_the_disk_is_full_in_a_bare_exception_is_read_as_a_full_disk():
    """RocksDB (through rocksdict) raises a bare ``Exception`` and words a full disk its own
    way: both are read (before, the line was the py4j proxy's own text)."""
    text = TASK_FAILED.replace(
        "rocksdict.RocksDBError: IO error: While appending to file: /data/cutline/local-state/j/op/"
        "1/db-a3/000042.log: Input/output error",
        "Exception: IO error: No space left on device: While appending to file: /data/ls/j/op/1/"
        "db-a3/MANIFEST-000012: No space left on device",
    )
    assert failure_summary(text) == (
        "micro-batch failed (task 1.0 in stage 14.0): disk full: no space left on device writing "
        "/data/ls/j/op/1/db-a3/MANIFEST-000012 (at state/rocksdb_store.py:301 in put)"
    )


def test_a_failed_task_names_its_stage_and_the_innermost_python_exception():
    assert failure_summary(TASK_FAILED) == (
        "micro-batch failed (task 1.0 in stage 14.0): rocksdict.RocksDBError: IO error: While "
        "appending to file: /data/cutline/local-state/j/op/1/db-a3/000042.log: Input/output "
        "error (at state/rocksdb_store.py:301 in put)"
    )


def test_a_java_trace_gives_its_root_cause():
    assert failure_summary(JAVA_ONLY) == (
        "checkpointing failed: java.io.FileNotFoundException: "
        "/data/warehouse/catalog/_delta_log (Permission denied)"
    )


def test_a_clean_first_line_is_kept_and_the_rest_dropped():
    user = (
        "stage 'count' (uid 'count', Counter.process_batch) raised ValueError: boom\n"
        'Traceback (most recent call last):\n  File "jobs.py", line 3, in process_batch\n'
        "ValueError: boom\n"
    )
    assert failure_summary(user) == user.splitlines()[0]
    bad = "bad record in source 'clicks' partition 1 at offset 4096: not JSON"
    assert failure_summary(bad) == bad
    assert failure_summary("x" * 5000) == "x" * 1000
    assert failure_summary("") == ""
