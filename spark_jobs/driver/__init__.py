"""The driver of an attempt: its start, restore, micro-batches, the barrier's return
path, completion, liveness and what its threads share. Nothing here runs on an executor."""
