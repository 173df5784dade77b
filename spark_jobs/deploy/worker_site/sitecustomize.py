"""Python's start-up hook for the processes Spark starts for a Cutline driver: its executors'
worker daemons, and the driver's data source planners and streaming source runner. This
directory is first on their ``PYTHONPATH`` after Spark's own entries (``session_conf``), so
Python imports this module before anything else runs: PySpark then comes from its installed,
compiled modules instead of the zip Spark puts first (spark_jobs/executor/python_path.py)."""

from spark_jobs.executor.python_path import use_installed_pyspark

use_installed_pyspark()
