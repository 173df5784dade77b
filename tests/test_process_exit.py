"""A ``cutline`` process ends with its command's status and whole output even when a native
library's teardown at ``exit()`` would abort it (spark_jobs/commands/process_exit.py). The fault
is made for real: a C exit handler, registered as C++ static destructors are, that calls
``abort()``, as a thread pool destroyed with a joinable thread does."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

# a process whose native teardown aborts: the handler runs at exit(), after Python's finalization
ABORT_AT_EXIT = """
import ctypes
libc = ctypes.CDLL(None)
libc.__cxa_atexit(libc.abort, None, None)
"""


def run(parts: list[str], argv: list[str], tmp_path) -> subprocess.CompletedProcess:
    script = "".join(textwrap.dedent(part) for part in [ABORT_AT_EXIT, *parts])
    return subprocess.run(
        [sys.executable, "-c", script, "--home", str(tmp_path), *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


CLI = """
from spark_jobs.commands.process_exit import cli
cli()
"""


def test_the_fault_is_real_without_the_ending(tmp_path):
    """The check below can fail: a plain ``sys.exit`` of the same command aborts."""
    plain = """
    import sys
    from spark_jobs.commands.main import main
    sys.exit(main())
    """
    done = run([plain], ["generate", "clicks", "--count", "10"], tmp_path)
    assert done.returncode == -signal.SIGABRT
    assert "appended 10 clicks records" in done.stdout


@pytest.mark.parametrize(
    ("argv", "status", "said"),
    [
        (["generate", "clicks", "--count", "100", "--format", "arrow"], 0, "appended 100 clicks"),
        (["verify", "clicks_per_user", "--checkpoint-root", "ftp://host/chk"], 2, "ftp://host"),
        (["--help"], 0, "usage: cutline"),
        (["no-such-command"], 2, "invalid choice"),
    ],
)
def test_a_command_ends_with_its_status_and_output_despite_an_abort_at_exit(
    argv, status, said, tmp_path
):
    done = run([CLI], argv, tmp_path)
    assert done.returncode == status, done.stderr
    assert said in done.stdout + done.stderr


def test_a_bug_still_ends_1_with_its_traceback(tmp_path):
    broken = """
    import spark_jobs.commands.main as commands
    def main():
        raise AssertionError("an invariant broke")
    commands.main = main
    """
    done = run([broken, CLI], ["--help"], tmp_path)
    assert done.returncode == 1
    assert "AssertionError: an invariant broke" in done.stderr


def test_the_exit_handlers_the_command_registered_still_run(tmp_path):
    registering = """
    import atexit
    import spark_jobs.commands.main as commands
    real = commands.main
    def main():
        atexit.register(lambda: print("handler ran"))
        return real()
    commands.main = main
    """
    done = run([registering, CLI], ["generate", "clicks", "--count", "10"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "handler ran"
