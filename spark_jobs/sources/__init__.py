"""The job's inputs as DataFrames (frames.py), bad records (bad_records.py), synthetic input
for the local log (generate.py). The sources themselves, each with its reader, are in
cutline/sources/."""
