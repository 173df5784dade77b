"""How a state file is encoded in durable storage: as it is, or as one zstd frame.

The working database keeps its blocks uncompressed, so that a lookup reads its block in place
(state/rocksdb_options.py). The copy in durable storage is written once and read only by a
remote restore, so it is compressed whole with zstd on its way there
(``CheckpointConfig.snapshot_compression``). A file's checksum is always the checksum of its own
bytes (as RocksDB wrote them), so local copies and restored files are checked the same way
whatever the codec; a stored file that does not decode, or decodes to other bytes, is reported
as corrupt.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pyarrow as pa

NONE = "none"
ZSTD = "zstd"
CODECS = (NONE, ZSTD)
DEFAULT_CODEC = ZSTD

_CHUNK = 4 << 20


class UndecodableFileError(Exception):
    """A stored file is not a valid frame of its codec (damaged or truncated)."""


def check_codec(codec: str, what: str = "codec") -> str:
    """``codec`` if Cutline knows it, else ValueError naming ``what``."""
    if codec not in CODECS:
        raise ValueError(f"{what} must be one of {', '.join(CODECS)}, got {codec!r}")
    return codec


def _copy(source, sink=None) -> str:
    """The checksum of what ``source`` reads to its end, written on to ``sink`` if given."""
    crc = 0
    while chunk := source.read(_CHUNK):
        crc = zlib.crc32(chunk, crc)
        if sink is not None:
            sink.write(chunk)
    return f"crc32:{crc:08x}"


def file_checksum(path: str | Path) -> str:
    """CRC-32 of a file's contents, as ``crc32:<8 hex digits>``."""
    with open(path, "rb") as f:
        return _copy(f)


def encode_file(source: Path, target: Path, codec: str) -> str:
    """Write ``source`` to ``target`` encoded with ``codec`` (``target`` is not used for
    :data:`NONE`: the file is stored as it is); return the checksum of ``source``'s bytes."""
    if codec == NONE:
        return file_checksum(source)
    with open(source, "rb") as raw, pa.CompressedOutputStream(str(target), check_codec(codec)) as z:
        return _copy(raw, z)


def decode_file(source: Path, target: Path, codec: str) -> str:
    """Write the bytes ``source`` encodes with ``codec`` (not :data:`NONE`) to ``target``;
    return their checksum. :class:`UndecodableFileError` if ``source`` is not a valid frame."""
    try:
        with (
            pa.input_stream(str(source), compression=check_codec(codec)) as z,
            open(target, "wb") as out,
        ):
            return _copy(z, out)
    except (OSError, pa.ArrowException) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise UndecodableFileError(f"not a valid {codec} frame: {e}") from e
