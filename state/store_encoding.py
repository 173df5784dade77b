"""Byte layouts of the state store that code without RocksDB needs: list state's framing and the
order-preserving encoding of timer timestamps. No ``rocksdict`` here: a process that only
defines or inspects jobs (the CLI, Dagster) never loads the state backend's native library."""

from __future__ import annotations

import struct
from collections.abc import Sequence

TS_OFFSET = 1 << 63  # a signed timestamp shifted so that big-endian bytes sort as numbers
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")


def encode_list(items: Sequence[bytes]) -> bytes:
    """Length-prefixed concatenation of list-state items."""
    return b"".join(U32.pack(len(i)) + i for i in items)


def decode_list(blob: bytes | None) -> list[bytes]:
    """The items :func:`encode_list` framed (none for ``None``)."""
    out: list[bytes] = []
    pos = 0
    while blob and pos < len(blob):
        (n,) = U32.unpack_from(blob, pos)
        out.append(blob[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out
