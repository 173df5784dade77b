"""Reading a store's files into the page cache (state/page_cache.py), checked against the
kernel's own account of which pages it holds (``mincore``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import time

import numpy as np
import pytest

from state import page_cache
from state.errors import BadInputError
from state.keygroups import KeyGroupRange
from state.page_cache import drop, prefetch
from state.rocksdb_options import StoreOptions
from state.rocksdb_store import RocksDBStore

PAGE = mmap.PAGESIZE
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="mincore and posix_fadvise")


def resident(path) -> float:
    """The share of ``path``'s pages the page cache holds, as the kernel says (``mincore``)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    pages = (size + PAGE - 1) // PAGE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        vec = ctypes.create_string_buffer(pages)
        try:
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw) / pages


def evicted(path) -> bool:
    """Drop ``path``'s pages from the page cache; False where the file system keeps them."""
    drop([path])
    return resident(path) < 0.1


@linux_only
def test_prefetch_reads_whole_files_into_the_page_cache_beyond_one_readahead_window(tmp_path):
    files = [tmp_path / f"{i:06d}.sst" for i in range(2)]
    for f in files:  # several chunks each: one WILLNEED alone stops at the readahead window
        f.write_bytes(os.urandom(3 * page_cache.CHUNK + PAGE + 17))
    if not all(evicted(f) for f in files):
        pytest.skip("this file system keeps the pages of a file asked to drop them (tmpfs?)")
    asked = prefetch([*files, tmp_path / "gone.sst"])  # a missing file is skipped
    assert asked == sum(f.stat().st_size for f in files)
    deadline = time.monotonic() + 10
    while min(resident(f) for f in files) < 1.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [resident(f) for f in files] == [1.0, 1.0]


def test_prefetch_asks_for_every_byte_in_chunks(tmp_path, monkeypatch):
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: asked.append((off, n)))
    f = tmp_path / "a.sst"
    f.write_bytes(b"x" * (2 * page_cache.CHUNK + 5))
    assert prefetch([f]) == f.stat().st_size
    assert asked == [(0, page_cache.CHUNK), (page_cache.CHUNK, page_cache.CHUNK),
                     (2 * page_cache.CHUNK, 5)]  # fmt: skip


@linux_only
def test_a_store_reads_its_files_into_the_page_cache_at_open_within_its_bound(tmp_path):
    path = tmp_path / "db"
    with RocksDBStore(path, KeyGroupRange(0, 63)) as store:
        txn = store.begin()
        n = 20_000
        txn.put("v", np.arange(n) % 64, [b"k%d" % i for i in range(n)], [os.urandom(100)] * n)
        txn.commit()
    ssts = sorted(path.glob("*.sst"))
    assert ssts
    if not all(evicted(f) for f in ssts):
        pytest.skip("this file system keeps the pages of a file asked to drop them (tmpfs?)")
    with RocksDBStore(path, KeyGroupRange(0, 63), StoreOptions(prefetch_mib=0)):
        pass  # off: the open itself reads only the files' footers, indexes and filters
    assert min(resident(f) for f in ssts) < 0.9
    with RocksDBStore(path, KeyGroupRange(0, 63)):
        deadline = time.monotonic() + 10
        while min(resident(f) for f in ssts) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [resident(f) for f in ssts] == [1.0] * len(ssts)


def test_a_negative_prefetch_bound_is_refused():
    with pytest.raises(BadInputError, match="prefetch_mib"):
        StoreOptions(prefetch_mib=-1)
