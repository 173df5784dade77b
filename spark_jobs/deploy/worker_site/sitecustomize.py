"""Python's start-up hook for the processes Spark starts for a Cutline driver: its executors'
worker daemons, and the driver's data source planners and streaming source runner. This
directory is on their ``PYTHONPATH`` (``session_conf``), so Python runs this module before
anything else: PySpark then comes from its installed, compiled modules instead of the zip Spark
puts first (spark_jobs/executor/python_path.py), and the ``sitecustomize`` Python would have
found without this one runs after it.

It loads python_path.py by its file, not as ``spark_jobs.executor.python_path``: importing the
``spark_jobs`` package this early would fix where the whole package comes from before the
process's own path is set up."""

import importlib.util
import os

_FILE = os.path.join(os.path.dirname(__file__), "..", "..", "executor", "python_path.py")
_spec = importlib.util.spec_from_file_location("_cutline_python_path", _FILE)
_python_path = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_python_path)
_python_path.use_installed_pyspark()
_python_path.run_next_sitecustomize(__file__)
