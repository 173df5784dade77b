"""The job's inputs as DataFrames (frames.py), the local log's files and Python data source
(local_log.py), bad records (bad_records.py), synthetic input (generate.py). The sources
themselves are in cutline/sources/."""
