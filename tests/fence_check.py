"""No commit from a fenced attempt, read from the Delta logs themselves: every commit of the
catalog's ``completed_checkpoints`` and of each sink's table, in version order, against the
fences recorded before it.

- ``completed_checkpoints``: the app transaction ``cutline-<job>`` holds ``attempt << 32 |
  checkpoint`` (spark_jobs/catalog/delta_catalog.py); a starting attempt commits ``attempt <<
  32``. The rows an append adds (their ``attempt``, from the add actions' statistics) must not
  be of an attempt below the highest fenced before that commit.
- A sink's table: every commit records ``cutline-fence-<job>-<sink>`` = its attempt
  (cutline/sinks/delta.py), the fence included; it must not be below one recorded before it.

Used by the kill matrix (tests/test_exactly_once.py) after its attempts; tested itself in
tests/test_fence_check.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from cutline.job import JobDefinition
from state.storage import open_storage
from state.storage.tables import join_url, table_uri

ATTEMPT_SHIFT = 32  # the catalog's fence: attempt << 32 | checkpoint id


def commits(table: str) -> Iterator[tuple[int, list[dict]]]:
    """The Delta table at ``table`` (a path or URL): each commit's version and actions, in
    version order, from its JSON log."""
    log = open_storage(join_url(table, "_delta_log"))
    names = [f.path for f in log.list() if f.path.endswith(".json") and f.path[:-5].isdigit()]
    for name in sorted(names, key=lambda n: int(n[:-5])):
        lines = log.get_bytes(name).decode().splitlines()
        yield int(name[:-5]), [json.loads(line) for line in lines if line.strip()]


def _fences(actions: list[dict], app: str) -> list[int]:
    return [a["txn"]["version"] for a in actions if a.get("txn", {}).get("appId") == app]


def _appended_attempts(actions: list[dict], job: str) -> list[int]:
    """The attempts of the job's rows an append adds: none for a fence, and none for a rewrite
    of rows already there (a status update, the catalog's compaction: they remove files)."""
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    if info.get("operation") != "WRITE" or any("remove" in a for a in actions):
        return []
    out = []
    for add in (a["add"] for a in actions if "add" in a):
        stats = json.loads(add.get("stats") or "{}")
        if not stats.get("numRecords"):
            continue
        if "attempt" not in stats.get("minValues", {}):
            raise AssertionError(f"{add['path']}: no statistics of its attempt: {stats}")
        if (add.get("partitionValues") or {}).get("job_id") == job:  # partitioned by job
            out.append(int(stats["minValues"]["attempt"]))
    return out


def fenced_checkpoint_commits(catalog: str, job: str) -> tuple[list[str], int]:
    """Appends to ``completed_checkpoints`` under ``catalog`` of rows of ``job`` by an attempt
    a newer one had fenced, each named; and how many appends of its rows were checked."""
    app, fence, late, checked = f"cutline-{job}", 0, [], 0
    for version, actions in commits(join_url(catalog, "completed_checkpoints")):
        for attempt in _appended_attempts(actions, job):
            checked += 1
            if attempt < fence:
                late.append(f"completed_checkpoints version {version}: a row of attempt "
                            f"{attempt} after attempt {fence}'s fence")  # fmt: skip
        for recorded in _fences(actions, app):
            fence = max(fence, recorded >> ATTEMPT_SHIFT)
    return late, checked


def fenced_sink_commits(output: str, job: str, sink: str, table: str) -> tuple[list[str], int]:
    """Commits to sink ``sink``'s table (``table`` under the output root ``output``) by an
    attempt below a fence recorded before them, each named; and how many commits were checked."""
    app, fence, late, checked = f"cutline-fence-{job}-{sink}", 0, [], 0
    for version, actions in commits(table_uri(output, table)):
        for attempt in _fences(actions, app):
            checked += 1
            if attempt < fence:
                late.append(f"sink {sink} version {version}: attempt {attempt} committed after "
                            f"attempt {fence}'s fence")  # fmt: skip
            fence = max(fence, attempt)
    return late, checked


def fenced_commits(catalog: str, output: str, job: JobDefinition) -> tuple[list[str], str]:
    """Every commit below a fence in ``job``'s checkpoint catalog and in each of its sinks' tables
    (under the roots ``catalog`` and ``output``), each named; and what was checked."""
    late, checked = fenced_checkpoint_commits(catalog, job.name)
    counts = [f"{checked} checkpoint commits"]
    for sink in job.sinks():
        more, checked = fenced_sink_commits(output, job.name, sink.name, sink.table)
        late += more
        counts.append(f"{checked} of sink {sink.name}")
    return late, ", ".join(counts)
