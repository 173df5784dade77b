"""``cutline``: parse the command line (spark_jobs/commands/parser.py) and run the subcommand's
handler (spark_jobs/commands/handlers.py); the exit code says what happened."""

from __future__ import annotations

import sys

from spark_jobs.commands import handlers
from spark_jobs.commands.parser import build_parser
from state.storage import StorageError


def main(argv: list[str] | None = None) -> int:
    """Run a command; the exit code says what an orchestrator should do (spark_jobs/errors.py):
    1 failed (restore it), 2 bad input or configuration (do not), 3 superseded (do not)."""
    from spark_jobs.deploy.python_env import python_environment
    from spark_jobs.deploy.settings import s3_environment
    from spark_jobs.errors import exit_code, failure_summary
    from spark_jobs.executor.python_path import use_installed_pyspark
    from state.faults import arm

    use_installed_pyspark()  # under spark-submit, Spark's zip is first on the path
    # the environment is final before any thread starts (no setenv beside a reader's getenv)
    python_environment()
    arm()  # crash tests' kill points (state/faults.py); nothing without CUTLINE_FAULT_KILL
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a supervisor's drivers run
    try:
        s3_environment()  # the file's endpoint and region, for every S3 client (no thread yet)
        return getattr(handlers, args.handler)(args)
    except (Exception, KeyboardInterrupt) as e:
        if isinstance(e, KeyboardInterrupt):
            return 130
        code = exit_code(e)
        if code == 1 and not isinstance(e, RuntimeError | StorageError):
            raise  # a bug, not an outcome: keep its traceback
        text = str(e).strip() or type(e).__name__
        more = " (the log above has the rest)" if "\n" in text else ""
        print(f"cutline: {failure_summary(text)}{more}", file=sys.stderr)
        return code


if __name__ == "__main__":  # the script spark-submit runs (spark_jobs/deploy/session.py)
    from spark_jobs.commands.process_exit import cli

    cli()
