"""Merge RocksDB databases whose key groups are disjoint by moving files, not keys.

A rescaled subtask that takes over the key groups of several old subtasks (scale-in) needs their
databases as one. Copying keys costs a Python call per key; RocksDB's ingestion of files another
database wrote and its column-family import are not exposed by rocksdict. What it does expose is
``RepairDB``: rebuild a database's MANIFEST from the SST files in its directory. So the files of
every part are hard-linked into one directory (renumbered so their names do not clash) and the
MANIFEST is rebuilt over all of them, in C++ and without rewriting a byte of data.

The repaired database holds every file in level 0, ordered newest first by largest sequence
number (RocksDB's rule when epoch numbers are unknown). That answers every read as the parts did
when, in each part,

- no file holds a key (or a range tombstone bound) outside the part's own key groups, so parts
  never hold versions of the same key and one part's tombstones cannot cover another's keys; and
- a file with a newer version of a key sorts before the file with the older one: the L0 files in
  the part's own order have strictly decreasing largest sequence numbers, and every file of a
  level has a larger one than every file of the levels below. Compactions take the oldest L0
  files first, so a database of L0 and one sorted level (every subtask's, below a few GiB) has
  this shape.

:func:`merge_by_files` checks both on each part's file list (``rocksdb.sstables``) before it
touches anything and says why it will not merge otherwise; the caller then copies keys.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import rocksdict as rd

from state.keygroups import KeyGroupRange

# " 17:2844414[450002 .. 500000]['0000...' seq:450049, type:1 .. '003F...' seq:499968, type:1](0)"
_FILE = re.compile(r"^\s*(\d+):\d+\[(\d+) \.\. (\d+)\]\['([0-9A-Fa-f]*)' .*? \.\. '([0-9A-Fa-f]*)'")
_LEVEL = re.compile(r"^--- level (\d+) ---")
_NUMBERED = re.compile(r"^(?:MANIFEST-)?(\d+)(?:\.\w+)?$|^OPTIONS-(\d+)$")


@dataclass(frozen=True)
class SstFile:
    """One live SST file: its level, number, sequence numbers and the key groups of its first
    and last key (range tombstone bounds included)."""

    level: int
    number: int
    smallest_seqno: int
    largest_seqno: int
    first_key_group: int
    last_key_group: int


def _key_group(hex_key: str) -> int:
    return int(hex_key[:4], 16) if len(hex_key) >= 4 else -1


def live_sst_files(path: Path) -> list[SstFile]:
    """The live SST files of the (closed) database at ``path``, each level in RocksDB's order."""
    db = rd.Rdict(str(path), rd.Options(raw_mode=True), access_type=rd.AccessType.read_only())
    try:
        listing = db.property_value("rocksdb.sstables") or ""
    finally:
        db.close()
    files, level = [], 0
    for line in listing.splitlines():
        if m := _LEVEL.match(line):
            level = int(m.group(1))
        elif m := _FILE.match(line):
            number, smallest, largest, first, last = m.groups()
            files.append(
                SstFile(
                    level,
                    int(number),
                    int(smallest),
                    int(largest),
                    _key_group(first),
                    _key_group(last),
                )
            )
        elif line.strip():
            raise ValueError(f"unexpected line in rocksdb.sstables of {path}: {line!r}")
    return files


def why_not_mergeable(files: list[SstFile], own: KeyGroupRange) -> str | None:
    """Why a part with ``files`` and key groups ``own`` cannot be merged by files (None: it can)."""
    for f in files:
        if f.first_key_group < own.start or f.last_key_group > own.end:
            return (
                f"file {f.number} spans key groups {f.first_key_group}..{f.last_key_group}, "
                f"outside {own.start}..{own.end}"
            )
    l0 = [f.largest_seqno for f in files if f.level == 0]
    if any(a <= b for a, b in itertools.pairwise(l0)):
        return f"level-0 files are not newest first by sequence number: {l0}"
    levels = sorted({f.level for f in files})
    for i, level in enumerate(levels[:-1]):
        newest_below = max(f.largest_seqno for f in files if f.level in levels[i + 1 :])
        oldest_here = min(f.largest_seqno for f in files if f.level == level)
        if oldest_here <= newest_below:
            return (
                f"level {level} has a file with largest sequence number {oldest_here}, "
                f"not above {newest_below} in the levels below"
            )
    return None


def _numbers(directory: Path) -> list[int]:
    out = []
    for entry in directory.iterdir():
        if m := _NUMBERED.match(entry.name):
            out.append(int(m.group(1) or m.group(2)))
    return out


def merge_by_files(
    target: Path, parts: list[tuple[Path, KeyGroupRange]], options: rd.Options
) -> str | None:
    """Merge the closed databases of ``parts`` (directory, its key groups) into ``target``, a new
    directory of hard links to their SST files; returns None, or why not (then ``target`` does
    not exist and the keys must be copied). The parts' directories are read, never changed.

    RocksDB's repair sets aside, with a warning only, a file it cannot read; so the rebuilt
    database is checked before it counts: every file linked is live, each where its part's key
    groups are, and nothing was set aside."""
    live = []
    for path, own in parts:
        try:
            files = live_sst_files(path)
        except ValueError as e:  # a listing this code cannot read: judge nothing by it
            return f"{Path(path).name}: {e}"
        reason = why_not_mergeable(files, own)
        on_disk = {p.name for p in Path(path).glob("*.sst")}
        if not reason and on_disk != {f"{f.number:06d}.sst" for f in files}:
            reason = "its directory holds SST files that are not live"  # repair would revive them
        if reason:
            return f"{Path(path).name}: {reason}"
        live.append(files)
    target = Path(target)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    expected: dict[int, KeyGroupRange] = {}  # file number in target -> its part's key groups
    next_number = max(_numbers(Path(parts[0][0])), default=0) + 1
    for i, ((path, own), files) in enumerate(zip(parts, live, strict=True)):
        for f in files:
            number = f.number if i == 0 else next_number
            next_number += i > 0
            os.link(Path(path) / f"{f.number:06d}.sst", target / f"{number:06d}.sst")
            expected[number] = own
    try:
        rd.Rdict.repair(str(target), options)
        problem = _rebuilt_wrong(target, expected)
    except Exception as e:  # rocksdict raises plain Exception with RocksDB's status
        problem = str(e)
    if problem:
        shutil.rmtree(target, ignore_errors=True)
        return f"merging the files failed: {problem}"
    shutil.rmtree(target / "lost", ignore_errors=True)  # the MANIFEST repair replaced
    return None


def _rebuilt_wrong(target: Path, expected: dict[int, KeyGroupRange]) -> str | None:
    """What is wrong with the repaired database at ``target`` (None: nothing)."""
    lost = sorted(p.name for p in (target / "lost").glob("*") if p.suffix in (".sst", ".log"))
    if lost:
        return f"RocksDB set aside {lost}"
    files = live_sst_files(target)
    if {f.number for f in files} != set(expected):
        return f"{len(files)} live files after the repair, {len(expected)} linked"
    for f in files:
        own = expected[f.number]
        if f.first_key_group < own.start or f.last_key_group > own.end:
            return f"file {f.number} spans key groups outside {own.start}..{own.end}"
    return None
