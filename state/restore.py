"""Restore a subtask's working database from a state handle, local copy first.

Order of preference, per file: the subtask's local copy of the same checkpoint (verified against
the handle's size and checksum, read from the file unless this host recorded it for the file as
it is: state/local_copies.py; hard-linked for immutable SST files), otherwise the primary copy in
durable storage (verified the same way). So a restore is fully local, partly local and partly
remote, or fully remote, and the report says how many bytes came from where. A corrupt local file
falls back to the remote copy; a missing or corrupt remote file raises an error naming it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from state.file_codec import NONE, UndecodableFileError, decode_file, file_checksum
from state.handles import StateFile, SubtaskStateHandle
from state.local_copies import LocalCopies, file_identity, settled_identity
from state.manifest import CheckpointManifest
from state.paths import JobLayout
from state.storage import DurableStorage, MissingFileError, StorageError


class ChecksumMismatchError(StorageError):
    """A file read from durable storage has the right size but the wrong contents."""


@dataclass
class RestoreReport:
    operator: str
    subtask: int
    checkpoint_id: int
    files_local: int = 0
    files_remote: int = 0
    bytes_local: int = 0
    bytes_remote: int = 0
    fallbacks: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    files_unread: int = 0  # local files taken by their recorded checksum, not read again

    @property
    def source(self) -> str:
        """``local``, ``remote`` or ``mixed``: where this subtask's bytes came from."""
        if self.files_remote == 0:
            return "local"
        return "remote" if self.files_local == 0 else "mixed"


def _usable_local(
    candidate: Path,
    expected: StateFile,
    report: RestoreReport,
    verified: dict[str, str],
    read: dict[str, str],
) -> bool:
    """Whether the local file ``candidate`` holds ``expected``'s bytes: its checksum as this
    host recorded it for the file as it is (``verified``), else as read now (added to ``read``
    by the file's settled identity)."""
    try:
        size = candidate.stat().st_size
        identity = file_identity(candidate)
    except FileNotFoundError:
        return False
    if size != expected.size:
        report.fallbacks.append(f"local {expected.local_name}: size {size} != {expected.size}")
        return False
    if verified.get(identity) == expected.checksum:
        report.files_unread += 1
        return True
    settled = settled_identity(candidate)
    checksum = file_checksum(candidate)
    if settled is not None:
        read[settled] = checksum
    if checksum != expected.checksum:
        report.fallbacks.append(f"local {expected.local_name}: checksum mismatch")
        return False
    return True


def fetch_file(storage: DurableStorage, path: str, f: StateFile, target: Path) -> None:
    """Copy ``f``'s stored copy at ``path`` to ``target`` as the file's own bytes (decoded),
    checked against its size and checksum. Raises MissingFileError, CorruptFileError (its size
    in storage) or :class:`ChecksumMismatchError` (it does not decode to ``f``'s bytes)."""
    if f.codec == NONE:
        storage.get_file(path, target, expected_size=f.stored_size)
        checksum, problem = file_checksum(target), None
    else:
        encoded = target.with_name(target.name + f".{f.codec}")
        storage.get_file(path, encoded, expected_size=f.stored_size)
        try:
            checksum, problem = decode_file(encoded, target, f.codec), None
        except UndecodableFileError as e:
            checksum, problem = None, str(e)
        finally:
            encoded.unlink(missing_ok=True)
    if problem is None and checksum == f.checksum and target.stat().st_size == f.size:
        return
    target.unlink(missing_ok=True)
    raise ChecksumMismatchError(
        f"{path!r} in {storage.url} does not match its checksum {f.checksum}"
        + (f" ({problem})" if problem else ""),
        path=path,
        url=storage.url,
    )


def _place_local(candidate: Path, target: Path) -> None:
    # SST files are immutable: a hard link costs nothing. RocksDB rewrites the others in place.
    if target.name.endswith(".sst"):
        try:
            os.link(candidate, target)
            return
        except OSError:
            pass
    shutil.copyfile(candidate, target)


def restore_subtask(
    handle: SubtaskStateHandle,
    storage: DurableStorage,
    layout: JobLayout,
    target: Path,
    copies: LocalCopies | None = None,
) -> RestoreReport:
    """Rebuild ``target`` (a working DB directory) as of ``handle``; replaces what was there.

    The directory appears complete or not at all: files are assembled in a sibling directory
    that replaces ``target`` only at the end.
    """
    started = time.perf_counter()
    report = RestoreReport(handle.operator, handle.subtask, handle.checkpoint_id)
    local = copies.find(handle.checkpoint_id) if copies is not None else None
    if copies is not None and local is None:
        report.fallbacks.append(f"no local copy of checkpoint {handle.checkpoint_id}")
    target = Path(target)
    staging = target.with_name(target.name + ".restoring")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    verified = copies.verified() if local is not None else {}
    read: dict[str, str] = {}
    try:
        for f in handle.files:
            dest = staging / f.local_name
            if local is not None and _usable_local(
                local[0] / f.local_name, f, report, verified, read
            ):
                try:
                    _place_local(local[0] / f.local_name, dest)
                    report.files_local += 1
                    report.bytes_local += f.size
                    continue
                except OSError as e:  # gone meanwhile (a cleanup on this host): the primary copy
                    report.fallbacks.append(f"local {f.local_name}: {e}")
            fetch_file(storage, layout.job_path(f.path), f, dest)
            report.files_remote += 1
            report.bytes_remote += f.size
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if local is not None:
        copies.record_verified(read)
    report.duration_s = time.perf_counter() - started
    return report


def read_manifest(storage: DurableStorage, path: str) -> CheckpointManifest:
    """The manifest at ``path``; :class:`~state.manifest.ManifestError` or
    :class:`~state.storage.StorageError` (e.g. missing) says why it cannot be used."""
    return CheckpointManifest.from_json(storage.get_bytes(path), source=path)


def validate_checkpoint(
    manifest: CheckpointManifest,
    storage: DurableStorage,
    *,
    checksums: bool = False,
    layout: JobLayout | None = None,
) -> list[str]:
    """Problems that would make ``manifest`` unrestorable: missing or wrongly sized files, and
    with ``checksums`` (which reads every byte) files whose contents do not match. Its files
    are under its job's directory, or ``layout``'s (a savepoint's).

    An empty list means the checkpoint is restorable as far as storage can tell.
    """
    layout = layout or JobLayout(manifest.job_id)
    with (
        tempfile.TemporaryDirectory(prefix="cutline-verify-") as scratch,
        ThreadPoolExecutor(max_workers=8, thread_name_prefix="cutline-verify") as pool,
    ):

        def check(n: int, f: StateFile) -> str | None:
            path = layout.job_path(f.path)
            try:
                info = storage.stat(path)
            except MissingFileError:
                return f"missing {path}"
            if info.size != f.stored_size:
                return f"{path}: size {info.size} != {f.stored_size}"
            if checksums:
                local = Path(scratch) / str(n)
                try:
                    fetch_file(storage, path, f, local)
                except ChecksumMismatchError:
                    return f"{path}: checksum mismatch (expected {f.checksum})"
                local.unlink()
            return None

        files = list(manifest.files())
        found = pool.map(check, range(len(files)), files)
        return [p for p in found if p is not None]
