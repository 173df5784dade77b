"""A table kept loaded (state/storage/tables.py ``LatestTable``) sees exactly what a fresh open
sees, on local disk and on the S3 server, without reloading the table on every use."""

from __future__ import annotations

import json
import threading
import time

import pyarrow as pa
import pytest
from deltalake.exceptions import TableNotFoundError

from spark_jobs.catalog.tables import read_delta
from state.storage import tables
from state.storage.tables import TABLE_PROPERTIES, LatestTable, open_table, write_table


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def uri(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "t")
    return f"{request.getfixturevalue('s3_root')}/t"


def append(uri: str, n: int) -> None:
    write_table(uri, pa.table({"n": [n]}), mode="append", configuration=TABLE_PROPERTIES)


def rows(dt) -> list[int]:
    return sorted(read_delta(dt).column("n").to_pylist())


def test_each_use_sees_every_commit_of_other_writers_and_loads_the_table_once(uri, monkeypatch):
    handle = LatestTable(uri)
    with handle.find() as dt:
        assert dt is None  # no table yet: none, and found once it exists
    with pytest.raises(TableNotFoundError), handle.latest():
        pass
    loads = []
    find = tables.find_table
    monkeypatch.setattr(tables, "find_table", lambda u: loads.append(u) or find(u))
    for n in range(25):  # past two log checkpoints written by the other writer
        append(uri, n)
        with handle.latest() as dt:
            assert dt.version() == open_table(uri).version() == n
            assert rows(dt) == list(range(n + 1))
    assert loads == [uri], "loaded whole once, then only brought up to date"


def test_a_failed_use_reloads_the_table_whole_at_the_next(uri, monkeypatch):
    append(uri, 0)
    handle = LatestTable(uri)
    with handle.latest():
        pass
    with pytest.raises(ZeroDivisionError), handle.latest():
        raise ZeroDivisionError
    loads = []
    find = tables.find_table
    monkeypatch.setattr(tables, "find_table", lambda u: loads.append(u) or find(u))
    append(uri, 1)
    with handle.latest() as dt:
        assert rows(dt) == [0, 1]
    assert loads == [uri]


def test_uses_are_serialised_and_a_nested_use_on_one_thread_raises(tmp_path):
    uri = str(tmp_path / "t")
    append(uri, 0)
    handle = LatestTable(uri)
    with handle.latest():
        with pytest.raises(RuntimeError, match="inside another"), handle.latest():
            pass
        entered = threading.Event()

        def use() -> None:
            with handle.latest():
                entered.set()

        other = threading.Thread(target=use)
        other.start()
        assert not entered.wait(0.3), "a second thread's use waits for the first to end"
    other.join(5)
    assert entered.is_set()


def test_commits_leave_the_log_whole_and_clean_log_removes_the_expired_entries(tmp_path):
    """No commit of a Cutline table lists the whole log to clean it (``TABLE_PROPERTIES``);
    its owner's ``clean_log`` removes the entries older than the log retention that a log
    checkpoint made unneeded, at most once per ``every_s``, and the table reads the same."""
    uri = str(tmp_path / "t")
    write_table(uri, pa.table({"n": [0]}), mode="append", configuration=TABLE_PROPERTIES)
    open_table(uri).alter.set_table_properties({"delta.logRetentionDuration": "interval 1 seconds"})
    log = tmp_path / "t" / "_delta_log"
    handle = LatestTable(uri)
    for n in range(1, 12):
        write_table(uri, pa.table({"n": [n]}), mode="append")
    time.sleep(1.5)
    for n in range(12, 24):  # a log checkpoint after the others expired
        write_table(uri, pa.table({"n": [n]}), mode="append")
    assert (log / f"{0:020d}.json").exists()  # no commit cleaned
    assert handle.clean_log(every_s=3600) is True
    entries = sorted(int(p.name.split(".")[0]) for p in log.glob("*.json"))
    checkpointed = json.loads((log / "_last_checkpoint").read_text())["version"]
    assert 0 < entries[0] <= checkpointed, (entries, checkpointed)
    assert handle.clean_log(every_s=3600) is False  # cleaned within the hour: not again
    with handle.latest() as dt:
        assert sorted(read_delta(dt).column("n").to_pylist()) == list(range(24))
