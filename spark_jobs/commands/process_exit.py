"""How a ``cutline`` process ends: with its command's exit status once Python's own shutdown has
run (non-daemon threads joined, every ``atexit`` handler, the standard streams flushed), and
without the native libraries' teardown after it.

Native thread pools (Arrow's, a Rust runtime's, RocksDB's) are destroyed by C++ static
destructors at ``exit()``; one destroyed with a thread still joinable calls ``std::terminate``, and
a command that had finished its work exits -6 ("terminate called without an active exception").
Ending with ``os._exit`` from the last ``atexit`` handler skips that teardown and nothing else.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


class _Ending:
    """The status the process ends with; an uncaught exception's is 1, as Python's own."""

    def __init__(self) -> None:
        self.status = 1

    def end(self) -> NoReturn:
        if "logging" in sys.modules:  # its handler may have been registered before this one
            sys.modules["logging"].shutdown()
        for stream in (sys.stdout, sys.stderr):
            # a closed pipe or stream: nothing more can be said
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(self.status)


def _status_of(exit: SystemExit) -> int:
    """The status Python gives a ``SystemExit``: its code, 0 for none, 1 for a message."""
    if exit.code is None:
        return 0
    return exit.code if isinstance(exit.code, int) else 1


def cli() -> NoReturn:
    """Run the ``cutline`` command (spark_jobs/commands/main.py) as a process. The handler that
    ends it is registered before the command runs, so ``atexit`` runs it after every other."""
    ending = _Ending()
    atexit.register(ending.end)
    from spark_jobs.commands.main import main

    try:
        ending.status = main()
    except SystemExit as e:
        ending.status = _status_of(e)
        raise
    sys.exit(ending.status)
