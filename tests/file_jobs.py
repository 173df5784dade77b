"""``clicks_per_user`` on a directory of JSON-lines files instead of the local log
(tests/test_file_source.py): a source added to Cutline without a change to the runtime. Loaded
by ``cutline run tests.file_jobs:file_clicks``; the directory is ``$CUTLINE_TEST_FILES`` (a
local path or an s3:// URL)."""

from __future__ import annotations

import dataclasses
import os

from cutline import FileSource, JobDefinition
from spark_jobs.job_loader import get_job

FILES_ENV = "CUTLINE_TEST_FILES"


def file_clicks() -> JobDefinition:
    job = get_job("clicks_per_user")
    schema = job.sources[0].schema
    source = FileSource("clicks", os.environ[FILES_ENV], schema, max_records_per_partition=1_500)
    return dataclasses.replace(job, name="file_clicks", sources=(source,))
