"""The command line as a user types it: a job by name or ``module:attr`` for every subcommand,
global options before or after the subcommand, ``generate --count`` in total. No Spark."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spark_jobs.commands.handlers import runtime_paths
from spark_jobs.commands.main import main
from spark_jobs.commands.parser import build_parser
from spark_jobs.sources.generate import records_in

REF = "tests.user_jobs:renamed"  # a job of one's own, registered nowhere; its name is "sessions"


@pytest.mark.parametrize(
    "argv",
    [
        ["--home", "H", "--warehouse", "W", "run", "j"],
        ["run", "j", "--home", "H", "--warehouse", "W"],
        ["--home", "H", "run", "j", "--warehouse", "W"],
    ],
)
def test_global_options_go_before_or_after_the_subcommand(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(argv)
    assert (args.home, args.warehouse, args.verbose) == ("H", "W", False)
    paths = runtime_paths(args)
    assert paths.warehouse == "W" and paths.log_root == str(tmp_path / "H" / "log")


def test_run_takes_spark_conf_as_spark_submit_does(capsys):
    args = build_parser().parse_args(
        ["run", "j", "--conf", "spark.a=1", "--conf", "spark.b=x=y", "--conf", "spark.c="]
    )
    assert args.conf == [("spark.a", "1"), ("spark.b", "x=y"), ("spark.c", "")]
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", "j", "--conf", "spark.a"])
    assert exit_.value.code == 2 and "expected KEY=VALUE, got 'spark.a'" in capsys.readouterr().err


def test_verbose_before_or_after_the_subcommand():
    assert build_parser().parse_args(["--verbose", "gc", "j"]).verbose
    assert build_parser().parse_args(["gc", "j", "--verbose"]).verbose


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["checkpoints"], "no checkpoints of job 'sessions'"),
        (["verify"], "no checkpoints of job 'sessions'"),
        (["compact", "--dry-run"], "sessions: no completed checkpoint to measure"),
        (["savepoints"], "sessions has no savepoints"),
    ],
)
def test_a_job_reference_works_for_every_subcommand(command, says, tmp_path, capsys):
    assert main([command[0], REF, *command[1:], "--home", str(tmp_path)]) in (0, 1)
    assert says in capsys.readouterr().out


def test_a_registered_name_works_as_before(tmp_path, capsys):
    assert main(["--home", str(tmp_path), "checkpoints", "clicks_per_user"]) == 1
    assert "no checkpoints of job 'clicks_per_user'" in capsys.readouterr().out


MY_JOBS = """
import dataclasses
from cutline import JobDefinition
from spark_jobs.job_loader import get_job

def sessions() -> JobDefinition:
    return dataclasses.replace(get_job("clicks_per_user"), name="my_sessions")

def helper():
    return 1
"""


@pytest.fixture
def my_package(tmp_path, monkeypatch):
    """``my_pkg/jobs.py`` in the current directory, installed nowhere, on no path."""
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "jobs.py").write_text(MY_JOBS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".")])
    yield tmp_path
    for name in ("my_pkg.jobs", "my_pkg"):
        __import__("sys").modules.pop(name, None)


@pytest.mark.parametrize("command", ["checkpoints", "verify", "run", "gc", "savepoints"])
@pytest.mark.parametrize(
    ("job", "says"),
    [
        (
            "clicks_per_usr",
            "no job named 'clicks_per_usr'; did you mean 'clicks_per_user' or "
            "'clicks_per_user_kafka'? (registered: clicks_per_user, ",
        ),
        ("zzz", "no job named 'zzz' (registered: clicks_per_user, "),
        (
            "my_pkg.jobs:session",
            "no attribute 'session'; did you mean 'sessions'? (its jobs: sessions)",
        ),
        (
            "my_pkg.jobs",
            "'my_pkg.jobs' names a module, not a job: a job reference is 'module:attribute', "
            "such as 'my_pkg.jobs:<attribute>'; 'my_pkg.jobs' has: sessions",
        ),
        (
            "my_pkg/jobs.py",
            "'my_pkg/jobs.py' is a file; name a job by its module and attribute: "
            "'my_pkg.jobs:<attribute>'; 'my_pkg.jobs' has: sessions",
        ),
    ],
)  # fmt: skip
def test_an_unknown_job_is_exit_2_with_what_was_meant_for_every_command(
    command, job, says, my_package, capsys
):
    assert main([command, job, "--home", str(my_package / "home")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cutline: ") and says in err, err


def test_a_module_in_the_current_directory_is_found_after_everything_installed(my_package, capsys):
    assert main(["checkpoints", "my_pkg.jobs:sessions", "--home", str(my_package / "h")]) == 1
    assert "no checkpoints of job 'my_sessions'" in capsys.readouterr().out


def test_a_job_only_the_catalog_knows_is_listed_by_the_read_only_commands(tmp_path, capsys):
    from spark_jobs.catalog.delta_catalog import DeltaCatalog

    home = tmp_path / "home"
    DeltaCatalog(home / "warehouse" / "catalog").begin_attempt("retired_job")
    assert main(["checkpoints", "retired_job", "--home", str(home)]) == 1
    assert "no checkpoints of job 'retired_job'" in capsys.readouterr().out
    assert main(["checkpoints", "retired_jbo", "--home", str(home)]) == 2
    assert "did you mean 'retired_job'?" in capsys.readouterr().err


def test_generate_count_is_the_total_unless_per_partition(tmp_path, capsys):
    home = ["--home", str(tmp_path)]
    assert main(["generate", "clicks", "--count", "5", *home]) == 0
    assert [records_in(tmp_path / "log", "clicks", p) for p in (0, 1)] == [3, 2]
    assert "appended 5 clicks" in capsys.readouterr().out
    assert main(["generate", "clicks", "--count", "5", "--per-partition", *home]) == 0
    assert [records_in(tmp_path / "log", "clicks", p) for p in (0, 1)] == [8, 7]


def test_generate_writes_the_format_asked_then_keeps_the_topics(tmp_path, capsys):
    home = ["--home", str(tmp_path)]
    assert main(["generate", "orders", "--count", "6", "--format", "arrow", *home]) == 0
    assert main(["generate", "orders", "--count", "4", *home]) == 0  # the topic's: Arrow
    assert [records_in(tmp_path / "log", "orders", p) for p in (0, 1)] == [5, 5]
    assert not list((tmp_path / "log" / "orders").glob("*.jsonl"))
    assert main(["generate", "orders", "--count", "2", "--format", "jsonl", *home]) == 2
    assert "this topic is in the Arrow format" in capsys.readouterr().err


@pytest.mark.s3
def test_a_missing_bucket_fails_the_run_at_once_naming_the_role(
    s3_server, tmp_path, capsys, monkeypatch
):
    """Exit 2 (a restart cannot help) before any JVM starts, the role and the bucket named, for
    every durable role; a warehouse that cannot be created names the first role under it."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    argv = ["--home", str(tmp_path), "run", "clicks_per_user"]
    assert main([*argv, "--checkpoint-root", "s3://no-such-bucket/chk"]) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        said.startswith("cutline: checkpoint root s3://no-such-bucket/chk:")
        and "NoSuchBucket" in said
    )
    for flag, role in (("--output-root", "output"), ("--staging-root", "staging")):
        assert main([*argv, flag, "s3://no-such-bucket/x"]) == 2
        said = capsys.readouterr().err.strip().splitlines()[-1]
        assert said.startswith(f"cutline: {role} s3://no-such-bucket/x:"), said
    (tmp_path / "blocker").write_text("a file")
    assert main([*argv, "--warehouse", str(tmp_path / "blocker" / "wh")]) == 2
    assert "cutline: catalog " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--stage", "nope", "--state", "x"], "job 'sessions' has no stage 'nope' (its stages: "),
        (["--stage", "sessionize", "--state", "nope"], "has no state 'nope' (its states: ["),
        (["--stage", "sessionize", "--state", "pages"], "has no completed checkpoint"),
    ],
)
def test_state_read_names_what_is_missing(flags, says, tmp_path, capsys):
    assert main(["state", "read", REF, *flags, "--home", str(tmp_path)]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ([], "sessions has never run: there is nothing to save"),
        (["--dispose", "no-such-savepoint"], "no savepoint at file://"),
    ],
)
def test_savepoint_names_what_is_missing(flags, says, tmp_path, capsys):
    assert main(["savepoint", REF, *flags, "--home", str(tmp_path)]) == 2
    assert says in capsys.readouterr().err


def test_savepoints_lists_each_with_what_it_holds_or_why_it_failed(tmp_path, capsys):
    from spark_jobs.catalog.delta_catalog import DeltaCatalog
    from spark_jobs.driver.savepoints import completed_row, savepoint_row
    from state.savepoint import SavepointInfo, SavepointRequest

    catalog = DeltaCatalog(tmp_path / "warehouse" / "catalog")
    job = SimpleNamespace(name="sessions", version="1.2", parallelism=2)
    failed = savepoint_row(
        job, SavepointRequest.new("", False, 1), "file:///a", status="FAILED", reason="denied"
    )
    catalog.record_savepoint(failed)
    here = tmp_path / "b"
    here.mkdir()
    (here / "_metadata").write_text("{}")  # only whether it is there is looked at
    info = SavepointInfo(f"file://{here}", "sessions", 3, 7, 12_345, 6, 0.5)
    catalog.record_savepoint(completed_row(job, SavepointRequest.new("", True, 2), info))
    moved = SavepointInfo(f"file://{tmp_path}/c", "sessions", 4, 9, 2_000, 2, 0.5)
    catalog.record_savepoint(completed_row(job, SavepointRequest.new("", False, 3), moved))
    assert main(["savepoints", REF, "--home", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "FAILED    file:///a  job version 1.2  denied",
        f"COMPLETED file://{here}  checkpoint 3 batch 7  12,345 B in 6 files  job version 1.2  "
        "(stopped)",
        f"COMPLETED file://{tmp_path}/c  checkpoint 4 batch 9  2,000 B in 2 files  job version "
        "1.2  (no longer there: moved or deleted; restore it from where it is now)",
    ]
