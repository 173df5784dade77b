"""The runtime of a job on Spark.

The driver's side: one attempt's lifecycle (run.py), what its threads share (run_state.py), its
micro-batches (micro_batches.py), what it reached (progress.py), the barrier's return path
(barrier.py), checkpoint completion (completion.py), where epochs ended (epoch_ends.py),
liveness (liveness.py); the start's decisions (start.py), the restore step (restore.py) with
placed restores, fallback and replay (recovery.py), the startup timeline (startup.py). The
executors' side: one subtask of one micro-batch (subtask.py), a micro-batch through the chain of
stages (dataflow.py), slot placement (placement.py), what their tasks report (reports.py).

Nothing is imported here: executors import subtask.py, dataflow.py and reports.py alone."""
