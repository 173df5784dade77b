"""The executors' Python worker daemon: PySpark's own, with the modules every subtask needs
imported before it forks a worker.

PySpark forks one worker process per concurrent task from this daemon; each worker then imports
what the task's function uses (pandas, Arrow, RocksDB, the runtime). Imported here once, those
modules come with every fork instead, which takes about a second of CPU off each worker's start,
on every executor, at every (re)start of a job. Set as ``spark.python.daemon.module`` by
``session_conf``. Nothing here starts a thread or opens a file, so forking stays safe.
"""

import pandas  # noqa: F401 (functions with use_pandas; PySpark's Arrow conversions)
import pyarrow  # noqa: F401
import rocksdict  # noqa: F401
from pyspark import daemon, worker  # noqa: F401

import spark_jobs.executor.dataflow
import spark_jobs.executor.subtask  # noqa: F401

if __name__ == "__main__":
    daemon.manager()
