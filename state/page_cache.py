"""Reading a store's files into the operating system's page cache ahead of its lookups.

A micro-batch's multi-get reads one block per key at random offsets across the whole working
state. A block the page cache holds costs a copy; one it does not costs a random read from disk,
several times more, and a kernel may evict file pages that were not touched for a while with
memory to spare (this project's machine pages out file pages idle for a minute or two). Read in
order, a store's files arrive several times faster than through the random reads that would
fault them in one block at a time (bench/results/README.md). :func:`prefetch` asks the kernel
for every byte of a set of files; pages already cached cost a lookup each, nothing more.
:func:`drop` is its inverse, for benchmarks and tests: files as a kernel leaves them idle.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

# One POSIX_FADV_WILLNEED reads at most about the device's readahead window (read_ahead_kb);
# a whole file is asked for in chunks of this many bytes.
CHUNK = 4 << 20


def prefetch(paths: Iterable[str | Path]) -> int:
    """Ask the kernel to read ``paths`` whole into the page cache; returns the bytes asked
    for. The reads happen in the kernel, mostly after this returns; nothing is copied into the
    process. A file that is gone or unreadable is skipped (the caller's own read reports it),
    and where the platform has no ``posix_fadvise`` nothing is done (0)."""
    if not hasattr(os, "posix_fadvise"):
        return 0
    asked = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            for offset in range(0, size, CHUNK):
                os.posix_fadvise(fd, offset, min(CHUNK, size - offset), os.POSIX_FADV_WILLNEED)
            asked += size
        except OSError:
            continue
        finally:
            os.close(fd)
    return asked


def drop(paths: Iterable[str | Path]) -> None:
    """Ask the kernel to drop ``paths`` from the page cache (their written pages are flushed
    first: dirty pages are not dropped). File systems that hold files in memory (tmpfs) keep
    them."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
