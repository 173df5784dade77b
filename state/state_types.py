"""What a keyed state is: its spec (name, kind, Arrow type, TTL), the fingerprint of its stored
form, and how its values and keys are encoded (state/user_state.py reads and writes them).

Values are stored in a fixed binary form per type: little-endian numbers, UTF-8 strings, raw
bytes. Keys are stored as bytes (UTF-8 strings, big-endian integers) beside their key group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state.errors import BadInputError
from state.keygroups import KeyType, key_groups

TTL_CLOCKS = ("processing", "event")
_FIXED = {
    pa.bool_(): "|b1",
    pa.int32(): "<i4",
    pa.int64(): "<i8",
    pa.float32(): "<f4",
    pa.float64(): "<f8",
}
_VARIABLE = (pa.string(), pa.binary())
STATE_TYPES = (*_FIXED, *_VARIABLE)


class StateDefinitionError(BadInputError):
    """A state spec is invalid (name, type or TTL); the message names it."""


class StateAccessError(BadInputError):
    """A state was used wrongly in a micro-batch (a null value, misaligned arrays)."""


@dataclass(frozen=True)
class Ttl:
    """Entries expire ``ms`` after their last write, by the ``clock``: ``"processing"`` (wall
    time, as in Flink) or ``"event"`` (the stage's watermark; the same on every replay)."""

    ms: int
    clock: str = "processing"

    def __post_init__(self) -> None:
        if not isinstance(self.ms, int) or self.ms < 1:
            raise StateDefinitionError(f"Ttl.ms must be a positive integer, got {self.ms!r}")
        if self.clock not in TTL_CLOCKS:
            raise StateDefinitionError(f"Ttl.clock must be one of {TTL_CLOCKS}, not {self.clock!r}")


def _check_type(where: str, t: pa.DataType) -> pa.DataType:
    if t not in STATE_TYPES:
        raise StateDefinitionError(
            f"{where}: type {t} is not storable; use one of {[str(s) for s in STATE_TYPES]}"
        )
    return t


@dataclass(frozen=True)
class StateSpec:
    """A keyed state: its ``name``, the Arrow ``type`` of its values, an optional ``ttl``, and
    ``encoding``: for a binary state whose bytes the function lays out itself, a name and version
    of that layout, so a restore into a different layout is refused (Flink's serializer
    snapshot)."""

    name: str
    type: pa.DataType
    ttl: Ttl | None = None
    encoding: str = field(default="", kw_only=True)
    kind = "value"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name.startswith("_"):
            raise StateDefinitionError(
                f"state name must be a non-empty string not starting with '_', got {self.name!r}"
            )
        if len(self.name.encode()) > 200:
            raise StateDefinitionError(f"state name {self.name!r} is longer than 200 bytes")
        _check_type(f"state {self.name!r}", self.type)

    def fingerprint(self) -> str:
        """The stored form of this state; a checkpoint restores only into the same one."""
        return self._stored_form(f"{self.kind}<{self.type}>")

    def _stored_form(self, kind_and_types: str) -> str:
        ttl = "ttl" if self.ttl else "no-ttl"
        encoding = f"/{self.encoding}" if self.encoding else ""
        return f"{kind_and_types}/{ttl}/v1{encoding}"


@dataclass(frozen=True)
class ValueStateSpec(StateSpec):
    """One value per key."""

    kind = "value"


@dataclass(frozen=True)
class ListStateSpec(StateSpec):
    """A list of values per key, appended to in arrival order."""

    kind = "list"


@dataclass(frozen=True)
class MapStateSpec(StateSpec):
    """A map per key, from ``key_type`` map keys to ``type`` values."""

    key_type: pa.DataType = pa.string()  # noqa: RUF009 - an immutable type object
    kind = "map"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_type(f"state {self.name!r} map key", self.key_type)

    def fingerprint(self) -> str:
        return self._stored_form(f"map<{self.key_type},{self.type}>")


# -- encoding ---------------------------------------------------------------------------------


def encode_values(values: pa.Array, t: pa.DataType, what: str) -> list[bytes]:
    """Every value's stored bytes (map keys of integer type sort as big-endian would not; they
    only need to be distinct)."""
    values = _storable(values, t, what)
    if t in _VARIABLE:
        return binary_values(values.cast(pa.binary()))
    raw, w = _fixed_bytes(values, t)
    return [raw[i : i + w] for i in range(0, len(raw), w)]


def encode_list_items(values: pa.Array, t: pa.DataType, what: str) -> pa.Array:
    """Every value's stored bytes framed as one list-state item (each after its length, as
    :func:`~state.store_encoding.encode_list` frames them), as a binary array."""
    values = _storable(values, t, what)
    if t in _VARIABLE:
        data = values.cast(pa.binary())
    else:
        data = _fixed_binary(*_fixed_bytes(values, t), len(values))
    return pc.binary_join_element_wise(*_length_prefixed(data), b"")


def binary_values(values: pa.Array | pa.ChunkedArray) -> list[bytes | None]:
    """A binary array's values as Python ``bytes`` (``None`` for nulls): through numpy, 4 to 12
    times faster than ``to_pylist``, which makes an Arrow scalar of every value first."""
    return values.to_numpy(zero_copy_only=False).tolist()


def _storable(values: pa.Array, t: pa.DataType, what: str) -> pa.Array:
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if values.null_count:
        raise StateAccessError(f"{what}: cannot store null values (clear the keys instead)")
    return values.cast(t)


def _fixed_bytes(values: pa.Array, t: pa.DataType) -> tuple[bytes, int]:
    """Values of a fixed-width type ``t`` as stored, end to end; and their width."""
    dtype = np.dtype(_FIXED[t])
    return values.to_numpy(zero_copy_only=False).astype(dtype).tobytes(), dtype.itemsize


def _length_prefixed(data: pa.Array) -> list[pa.Array]:
    """A binary array as two to join element-wise: each value's length (4 bytes, big-endian),
    then the value (how list items and a composite key's columns are framed)."""
    lengths = pc.binary_length(data).to_numpy(zero_copy_only=False).astype(">u4")
    return [_fixed_binary(lengths.tobytes(), 4, len(data)), data]


def decode_values(raw: list[bytes | None], t: pa.DataType) -> pa.Array:
    """The inverse of :func:`encode_values`; ``None`` decodes to null."""
    if t in _VARIABLE:
        return pa.array(raw, pa.binary()).cast(t)
    present = np.fromiter((v is not None for v in raw), bool, len(raw))
    data = np.zeros(len(raw), np.dtype(_FIXED[t]))
    data[present] = np.frombuffer(b"".join(v for v in raw if v is not None), data.dtype)
    return pa.array(data, type=t, mask=~present)


@dataclass(frozen=True)
class KeyCodec:
    """The stage's keys as stored: bytes (UTF-8 strings, big-endian integers) and key groups.

    A composite key (``key_type`` a tuple of column types) comes as a struct array of its
    columns (``names``) and is stored as its columns' bytes, each after its length (4 bytes,
    big-endian), so the encoding is unambiguous and decodes back to the struct.

    The last arrays encoded are remembered by identity: a function that reads and then writes
    the same keys (the usual get, compute, update) encodes them once."""

    key_type: KeyType
    max_parallelism: int
    names: tuple[str, ...] = ()  # a composite key's column names
    _recent: list = field(default_factory=list, compare=False, repr=False)

    @property
    def composite(self) -> bool:
        return not isinstance(self.key_type, str)

    def encode(self, keys: pa.Array) -> tuple[np.ndarray, list[bytes]]:
        for seen, encoded in self._recent:
            if seen is keys:
                return encoded
        original = keys
        keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        if self.composite:
            encoded = self._encode_composite(keys)
        else:
            if keys.null_count:
                raise StateAccessError(f"{keys.null_count} null keys")
            encoded = (
                key_groups(keys, self.key_type, self.max_parallelism),
                key_bytes(keys, self.key_type),
            )
        self._recent[:] = [(original, encoded), *self._recent[:3]]  # holds the arrays alive
        return encoded

    def _encode_composite(self, keys: pa.Array) -> tuple[np.ndarray, list[bytes]]:
        types = self.key_type
        if not pa.types.is_struct(keys.type) or keys.type.num_fields != len(types):
            raise StateAccessError(
                f"a key of columns {list(self.names)} is a struct array of them "
                "(ctx.key_of(table) builds it)"
            )
        columns = keys.flatten()
        nulls = sum(c.null_count for c in columns) + keys.null_count
        if nulls:
            raise StateAccessError(f"{nulls} null key columns")
        parts = []
        for column, t in zip(columns, types, strict=True):
            parts += _length_prefixed(_key_binary(column, t))
        joined = binary_values(pc.binary_join_element_wise(*parts, b""))  # in Arrow, not per row
        return key_groups(keys, types, self.max_parallelism), joined

    def decode(self, raw: list[bytes]) -> pa.Array:
        if not self.composite:
            return _decode_column(pa.array(raw, pa.binary()), self.key_type)
        arrays = [
            _decode_column(c, t)
            for c, t in zip(_split_prefixed(raw, len(self.key_type)), self.key_type, strict=True)
        ]
        return pa.StructArray.from_arrays(arrays, list(self.names))


def _split_prefixed(raw: list[bytes], columns: int) -> list[pa.Array]:
    """Composite keys back to one binary array per column: each key is its columns' bytes,
    each after its 4-byte big-endian length. Gathered with numpy, not parsed per key."""
    buf = np.frombuffer(b"".join(raw), np.uint8)
    sizes = np.fromiter(map(len, raw), np.int64, len(raw))
    at = np.concatenate([[0], np.cumsum(sizes)])[:-1].astype(np.int64)
    out = []
    for _ in range(columns):
        head = buf[at[:, None] + np.arange(4)].astype(np.int64)
        n = (head[:, 0] << 24) | (head[:, 1] << 16) | (head[:, 2] << 8) | head[:, 3]
        start = at + 4
        offsets = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
        gather = np.repeat(start - offsets[:-1], n) + np.arange(offsets[-1])
        buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(buf[gather].tobytes())]
        out.append(pa.BinaryArray.from_buffers(pa.binary(), len(raw), buffers))
        at = start + n
    return out


def _decode_column(raw: pa.Array, key_type: str) -> pa.Array:
    """One key column from its stored bytes (a binary array)."""
    if key_type in ("string", "binary"):
        return raw.cast(pa.string()) if key_type == "string" else raw
    width = 4 if key_type == "int" else 8
    offsets = np.frombuffer(raw.buffers()[1], np.int32)[raw.offset : raw.offset + len(raw) + 1]
    values = np.frombuffer(raw.buffers()[2] or b"", np.uint8)[offsets[0] : offsets[-1]]
    data = values.view(f">i{width}").astype(f"<i{width}")
    return pa.array(data, pa.int32() if width == 4 else pa.int64())


def key_bytes(column: pa.Array, key_type: str) -> list[bytes]:
    """Keys as the bytes stored in RocksDB: UTF-8 for strings, big-endian for integers."""
    if key_type in ("string", "binary"):
        return binary_values(column.cast(pa.binary()))
    raw, width = _big_endian(column, key_type)
    return [raw[i : i + width] for i in range(0, len(raw), width)]


def _key_binary(column: pa.Array, key_type: str) -> pa.Array:
    """:func:`key_bytes` as an Arrow binary array."""
    if key_type in ("string", "binary"):
        return column.cast(pa.binary())
    raw, width = _big_endian(column, key_type)
    return _fixed_binary(raw, width, len(column))


def _big_endian(column: pa.Array, key_type: str) -> tuple[bytes, int]:
    """An integer key column's values, big-endian, end to end; and their width."""
    width = 4 if key_type == "int" else 8
    return column.to_numpy(zero_copy_only=False).astype(f">i{width}").tobytes(), width


def _fixed_binary(raw: bytes, width: int, n: int) -> pa.Array:
    """A binary array of ``n`` values of ``width`` bytes each, laid end to end in ``raw``."""
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, pa.py_buffer(raw)])
    return fixed.cast(pa.binary())
