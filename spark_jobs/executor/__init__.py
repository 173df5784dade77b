"""What runs inside Spark tasks on the executors: a micro-batch's stage tasks
(dataflow.py, subtask.py) and the typed reports they send back (reports.py). Imports nothing
of the driver's."""
