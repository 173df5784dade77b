"""Relative storage paths and the layout of a job's checkpoint directory (docs/design.md §8).

Every path Cutline stores in a manifest or passes to durable storage is a '/'-separated path
relative to a root. :func:`check_relative` is the one gate they all pass: it rejects anything that
could escape the root, so a manifest cannot make restore or GC touch files outside its job.
"""

from __future__ import annotations

import re

from state.errors import BadInputError

_SEGMENT = re.compile(r"^[A-Za-z0-9_.=+,@-]+$")


class PathEscapeError(BadInputError):
    """A path is absolute, contains '..' or odd characters, or otherwise leaves its root."""


def check_relative(path: str, *, what: str = "path") -> str:
    """Return ``path`` unchanged if it is a clean relative path inside its root, else raise."""
    if not isinstance(path, str) or not path:
        raise PathEscapeError(f"{what} must be a non-empty string, got {path!r}")
    if path.startswith("/") or "\\" in path or "\x00" in path:
        raise PathEscapeError(f"{what} {path!r} escapes its root (absolute or not '/'-separated)")
    for segment in path.split("/"):
        if segment in ("", ".", "..") or not _SEGMENT.match(segment):
            raise PathEscapeError(
                f"{what} {path!r} escapes its root or has a bad segment {segment!r}"
            )
    return path


def join(*parts: str) -> str:
    """Join relative path parts with '/' and check the result."""
    return check_relative("/".join(str(p).strip("/") for p in parts if str(p)))


class JobLayout:
    """Relative paths of one job's files under the checkpoint root.

    ``<job>/shared/<operator>/<subtask>/<unique>.sst`` (shared, immutable),
    ``<job>/chk-<n>/_metadata`` (written last) and ``<job>/chk-<n>/<operator>/<subtask>/<file>``.
    Manifest paths are relative to the job root (``job_path`` turns them into storage paths).
    """

    METADATA = "_metadata"
    CLAIM = "_claim"  # created exclusively when checkpoint n is triggered: ids never collide

    def __init__(self, job_id: str) -> None:
        self.job_id = check_relative(job_id, what="job_id")
        if "/" in job_id:
            raise PathEscapeError(f"job_id {job_id!r} must be a single path segment")

    def job_path(self, relative: str) -> str:
        return join(self.job_id, check_relative(relative, what="manifest path"))

    @staticmethod
    def checkpoint_dir(checkpoint_id: int) -> str:
        return f"chk-{int(checkpoint_id)}"

    def metadata(self, checkpoint_id: int) -> str:
        return f"{self.checkpoint_dir(checkpoint_id)}/{self.METADATA}"

    def claim(self, checkpoint_id: int) -> str:
        return f"{self.checkpoint_dir(checkpoint_id)}/{self.CLAIM}"

    @staticmethod
    def private_file(checkpoint_id: int, operator: str, subtask: int, name: str) -> str:
        return join(JobLayout.checkpoint_dir(checkpoint_id), operator, str(int(subtask)), name)

    @staticmethod
    def shared_file(operator: str, subtask: int, unique_name: str) -> str:
        return join("shared", operator, str(int(subtask)), unique_name)

    @staticmethod
    def checkpoint_id_of(relative: str) -> int | None:
        """The checkpoint id of a path under ``chk-<n>/``, or None for other paths."""
        head = relative.split("/", 1)[0]
        if head.startswith("chk-") and head[4:].isdigit():
            return int(head[4:])
        return None


class SavepointLayout(JobLayout):
    """Relative paths inside a savepoint directory (state/savepoint.py): ``_metadata`` and the
    files of one checkpoint laid out as in a job's directory, relative to the savepoint's
    directory itself (where a job's are relative to ``<job>/``)."""

    def __init__(self) -> None:
        self.job_id = ""

    def job_path(self, relative: str) -> str:
        return check_relative(relative, what="manifest path")
