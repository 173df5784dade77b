"""A task's store released after its compactions (state/rocksdb_release.py): the next opener,
in this process or another, waits for the lock; a process killed meanwhile loses no write."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import rocksdict as rd

from state.keygroups import KeyGroupRange
from state.rocksdb_options import StoreOptions
from state.rocksdb_release import open_when_released
from state.rocksdb_store import RocksDBStore

HOLDER = """
import sys, time
import rocksdict as rd
db = rd.Rdict(sys.argv[1], rd.Options(raw_mode=True))
print("held", flush=True)
time.sleep(float(sys.argv[2]))
db.close()
"""


def _held_by_another_process(path, seconds: float) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_an_open_waits_for_a_lock_another_process_holds_then_fails_past_its_bound(tmp_path):
    path = tmp_path / "db"
    holder = _held_by_another_process(path, 1.5)
    started = time.monotonic()
    with RocksDBStore(path, KeyGroupRange(0, 7)) as store:
        assert time.monotonic() - started > 0.5, "it waited for the other process"
        assert store.get_many("v", np.zeros(1, dtype=int), [b"k"]) == [None]
    holder.wait(30)

    holder = _held_by_another_process(path, 30)
    try:
        with pytest.raises(Exception, match="LOCK"):
            open_when_released(
                path, lambda: rd.Rdict(str(path), rd.Options(raw_mode=True)), wait_s=0.3
            )
    finally:
        holder.kill()
        holder.wait(30)
    with pytest.raises(Exception, match=r"Invalid argument|does not exist"):  # not a lock: at once
        missing = tmp_path / "missing"
        open_when_released(missing, lambda: rd.Rdict(str(missing), _no_create()), wait_s=30)


def _no_create() -> rd.Options:
    options = rd.Options(raw_mode=True)
    options.create_if_missing(False)
    return options


KILLED_IN_A_RELEASE = """
import os, sys
import numpy as np
from state.keygroups import KeyGroupRange
from state.rocksdb_options import StoreOptions
from state.rocksdb_store import RocksDBStore

path, r = sys.argv[1], KeyGroupRange(0, 127)
options = StoreOptions(l0_compaction_trigger=2, l0_bytes_ratio=0)
n = 200_000
keys = [b"k%07d" % i for i in range(n)]
with RocksDBStore(path, r, options) as s:
    txn = s.begin()
    txn.put("v", np.arange(n) % 128, keys, [b"base" * 25] * n)
    txn.commit()
    s.compact()
for task in range(40):
    s = RocksDBStore(path, r, options)
    some = np.random.default_rng(task).choice(n, 20_000, replace=False)
    txn = s.begin()
    txn.put("v", some % 128, [keys[i] for i in some], [b"t%03d" % task * 25] * len(some))
    txn.commit()
    if s.close_after_compactions() is not None:  # a compaction runs on: killed in it
        print(task, flush=True)
        os._exit(0)
print("none", flush=True)
"""


def test_a_process_killed_while_its_release_waits_for_a_compaction_loses_no_write(tmp_path):
    """PySpark's workers end with ``os._exit``: a release in progress then ends with the process,
    its compaction's work lost, and every write the task made is there at the next open."""
    path = tmp_path / "db"
    out = subprocess.run(
        [sys.executable, "-c", KILLED_IN_A_RELEASE, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.split()[-1]
    assert last != "none", "no compaction outlived a task: the test exercises nothing"
    task = int(last)
    some = np.random.default_rng(task).choice(200_000, 20_000, replace=False)
    options = StoreOptions(l0_compaction_trigger=2, l0_bytes_ratio=0)
    with RocksDBStore(path, KeyGroupRange(0, 127), options, compactions=False) as store:
        got = store.get_many("v", some % 128, [b"k%07d" % i for i in some])
    assert got == [b"t%03d" % task * 25] * len(some)
