"""``cutline``'s exit code is chosen by what went wrong, not by an exception's base class
(spark_jobs/errors.py): input or configuration that is wrong exits 2 whichever layer found it
(``BadInputError`` in state/, ``NonRetryableError`` in the runtime); a ``ValueError`` that only
says a read raced a writer (``pyarrow.ArrowInvalid``, ``json.JSONDecodeError``) or that a bug
broke an invariant exits 1, so a restore retries it."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline.sources.log_format import MalformedRecordError
from cutline.validation import JobDefinitionError
from spark_jobs.commands.main import main
from spark_jobs.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_SUPERSEDED,
    ConfigurationError,
    exit_code,
)
from state.catalog import FencedError
from state.config import CheckpointConfig
from state.errors import BadInputError
from state.keygroups import check_parallelism
from state.manifest import CheckpointManifest
from state.paths import check_relative
from state.storage import open_storage


def raised(call) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return info.value


def torn_parquet() -> BaseException:
    """What pyarrow raises for a Parquet file read while its writer was half way."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"a": [1, 2, 3]}), sink)
    data = sink.getvalue().to_pybytes()
    return raised(lambda: pq.read_table(pa.BufferReader(data[: len(data) // 2])))


@pytest.mark.parametrize(
    "make",
    [
        lambda: raised(lambda: open_storage("ftp://host/x")),
        lambda: raised(lambda: open_storage("s3://Bad_Bucket!/x")),
        lambda: raised(lambda: check_parallelism(0, 128)),
        lambda: raised(lambda: check_relative("../x")),
        lambda: raised(lambda: CheckpointConfig(interval_ms=-1)),
        lambda: raised(lambda: CheckpointManifest.from_json(b'{"checkpoint_id": "x"}')),
        lambda: JobDefinitionError("stage 'a' has no key"),
        lambda: MalformedRecordError("line 3 is not JSON"),
        lambda: ConfigurationError("the root holds none of the job's files"),
    ],
    ids=["url", "bucket", "parallelism", "path", "config", "manifest", "job", "record", "root"],
)
def test_input_or_configuration_that_is_wrong_exits_2_whichever_layer_found_it(make):
    error = make()
    assert isinstance(error, BadInputError | ConfigurationError), type(error)
    assert exit_code(error) == EXIT_BAD_INPUT


@pytest.mark.parametrize(
    "make",
    [
        torn_parquet,
        lambda: raised(lambda: json.loads('{"checkpoint_id": 4, "subt')),
        lambda: ValueError("an invariant a bug broke"),
    ],
    ids=["torn parquet", "torn json", "plain ValueError"],
)
def test_a_read_that_raced_a_writer_or_a_bug_exits_1_and_is_retried(make):
    error = make()
    assert isinstance(error, ValueError) and not isinstance(error, BadInputError)
    assert exit_code(error) == EXIT_FAILED


def test_a_newer_attempt_exits_3():
    assert exit_code(FencedError("attempt 4 started")) == EXIT_SUPERSEDED


def test_a_bad_url_given_to_a_command_exits_2_naming_it(tmp_path, capsys):
    code = main(["verify", "clicks_per_user", "--checkpoint-root", "ftp://host/chk"])
    assert code == EXIT_BAD_INPUT
    assert "cutline: unsupported storage url 'ftp://host/chk'" in capsys.readouterr().err
