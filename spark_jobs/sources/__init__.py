"""The job's inputs: the replayable local log and Kafka as DataFrames (frames.py), the log
itself (local_log.py), bad records (bad_records.py), synthetic input (generate.py)."""
