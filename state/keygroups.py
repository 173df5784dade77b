"""Key groups: the unit of keyed-state ownership and redistribution (Flink's key groups).

A key maps to one of ``max_parallelism`` key groups by ``pmod(hash(key), max_parallelism)`` where
``hash`` is Spark SQL's ``hash()`` (Murmur3 x86_32, seed 42). The Python implementation here is
bit-for-bit the same function, so the driver can compute key groups vectorised in Spark SQL
(:func:`spark_key_group_sql`) while ``state/`` computes them without Spark; a test proves they
agree.

A subtask ``i`` of ``parallelism`` subtasks owns the contiguous range Flink assigns to operator
index ``i`` (:func:`key_group_range`), and a key group belongs to subtask
``key_group * parallelism // max_parallelism``.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from state.errors import BadInputError

DEFAULT_MAX_PARALLELISM = 128
MAX_MAX_PARALLELISM = 32768  # key groups are stored as two big-endian bytes
SPARK_HASH_SEED = 42

# Key types Spark's hash() and this module agree on, by the Spark SQL type name.
KEY_TYPES = ("string", "binary", "int", "bigint")

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_M5 = np.uint32(5)
_N1 = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)


@dataclass(frozen=True, order=True)
class KeyGroupRange:
    """Inclusive range ``[start, end]`` of key groups; empty when ``end < start``."""

    start: int
    end: int

    def __contains__(self, key_group: object) -> bool:
        # numbers.Integral also admits numpy integers (e.g. an element of a key_groups() array).
        if isinstance(key_group, bool) or not isinstance(key_group, numbers.Integral):
            return False
        return self.start <= int(key_group) <= self.end

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __iter__(self):
        return iter(range(self.start, self.end + 1))

    def to_list(self) -> list[int]:
        return [self.start, self.end]

    @classmethod
    def from_list(cls, pair: Iterable[int]) -> KeyGroupRange:
        start, end = (int(x) for x in pair)
        return cls(start, end)


def check_parallelism(parallelism: int, max_parallelism: int) -> None:
    """Raise a ``BadInputError`` naming the field unless
    ``1 <= parallelism <= max_parallelism``."""
    if not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
        raise BadInputError(
            f"max_parallelism must be in [1, {MAX_MAX_PARALLELISM}], got {max_parallelism}"
        )
    if not 1 <= parallelism <= max_parallelism:
        raise BadInputError(
            f"parallelism must be in [1, max_parallelism={max_parallelism}], got {parallelism}"
        )


def key_group_range(subtask: int, parallelism: int, max_parallelism: int) -> KeyGroupRange:
    """The contiguous key-group range operator index ``subtask`` owns (Flink's assignment)."""
    check_parallelism(parallelism, max_parallelism)
    if not 0 <= subtask < parallelism:
        raise ValueError(f"subtask must be in [0, {parallelism}), got {subtask}")
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def subtask_for_key_group(key_group, parallelism: int, max_parallelism: int):
    """Subtask owning ``key_group``: an int for an int, an int32 array for an array."""
    check_parallelism(parallelism, max_parallelism)
    if isinstance(key_group, numbers.Integral) and not isinstance(key_group, bool):
        kg = int(key_group)
        if not 0 <= kg < max_parallelism:
            raise ValueError(f"key_group must be in [0, {max_parallelism}), got {kg}")
        return kg * parallelism // max_parallelism
    # int64: a narrow input dtype (int16, int32) would overflow in key_group * parallelism.
    kg = np.asarray(key_group, dtype=np.int64)
    if kg.size and (kg.min() < 0 or kg.max() >= max_parallelism):
        raise ValueError(
            f"key_group must be in [0, {max_parallelism}), got values in [{kg.min()}, {kg.max()}]"
        )
    return (kg * parallelism // max_parallelism).astype(np.int32)


# --- Murmur3 x86_32 as Spark implements it (org.apache.spark.unsafe.hash.Murmur3_x86_32) -------


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * _M5 + _N1


def _fmix(h1: np.ndarray, length: np.ndarray) -> np.ndarray:
    h1 = h1 ^ length.astype(np.uint32)
    h1 = h1 ^ (h1 >> np.uint32(16))
    h1 = h1 * _F1
    h1 = h1 ^ (h1 >> np.uint32(13))
    h1 = h1 * _F2
    return h1 ^ (h1 >> np.uint32(16))


def _hash_int32(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    k1 = values.astype(np.int32).view(np.uint32)
    return _fmix(_mix_h1(seed, _mix_k1(k1)), np.full(len(values), 4, np.uint32))


def _hash_int64(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    v = values.astype(np.int64).view(np.uint64)
    low = (v & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (v >> np.uint64(32)).astype(np.uint32)
    h1 = _mix_h1(seed, _mix_k1(low))
    h1 = _mix_h1(h1, _mix_k1(high))
    return _fmix(h1, np.full(len(values), 8, np.uint32))


def _hash_bytes(offsets: np.ndarray, data: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Spark's ``hashUnsafeBytes``: 4-byte little-endian words, then each tail byte signed."""
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    words = lengths // 4
    # Murmur3 is sequential within a key, so loop over word positions, vectorised across keys.
    # Sorted longest-first, the keys that still have a word at position w are a prefix, so each
    # step touches only those keys (one long key does not make every step cost O(n)).
    order = np.argsort(-words, kind="stable")
    starts, lengths, words = starts[order], lengths[order], words[order]
    h1 = seed[order].copy()
    neg_words = -words  # ascending
    u32 = np.uint32
    for w in range(int(words.max(initial=0))):
        live = int(np.searchsorted(neg_words, -w, side="left"))  # keys with words > w
        pos = starts[:live] + 4 * w
        word = (
            data[pos].astype(u32)
            | (data[pos + 1].astype(u32) << u32(8))
            | (data[pos + 2].astype(u32) << u32(16))
            | (data[pos + 3].astype(u32) << u32(24))
        )
        h1[:live] = _mix_h1(h1[:live], _mix_k1(word))
    tail_start = starts + 4 * words
    for t in range(3):
        live = np.flatnonzero(4 * words + t < lengths)
        if live.size == 0:
            break
        byte = data[tail_start[live] + t]
        signed = byte.view(np.int8).astype(np.int32).view(np.uint32)  # Java's (int) of a byte
        h1[live] = _mix_h1(h1[live], _mix_k1(signed))
    out = np.empty_like(h1)
    out[order] = _fmix(h1, lengths.astype(np.uint32))
    return out


KeyType = str | tuple[str, ...]  # one column's type, or a composite key's, column by column


def key_types_of(key_type: KeyType) -> tuple[str, ...]:
    """The column types of a key type (one for a single-column key); raises on unknown ones."""
    types = (key_type,) if isinstance(key_type, str) else tuple(key_type)
    bad = [t for t in types if t not in KEY_TYPES]
    if not types or bad:
        raise ValueError(
            f"key_type must be one of {KEY_TYPES} or a tuple of them, got {key_type!r}"
        )
    return types


def spark_hash(keys: pa.Array | list, key_type: KeyType) -> np.ndarray:
    """Spark SQL ``hash(key)`` for every key, as int32; a null key hashes to the seed (42).

    A composite key (``key_type`` a tuple) is a struct array of its columns and hashes as Spark's
    ``hash(struct(a, b))``, which is ``hash(a, b)``: each column hashed with the previous one's
    hash as the seed, a null column leaving it unchanged."""
    types = key_types_of(key_type)
    arr = keys if isinstance(keys, (pa.Array, pa.ChunkedArray)) else pa.array(keys)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    seed = np.full(len(arr), SPARK_HASH_SEED, np.uint32)
    if isinstance(key_type, str):
        return _hash_column(arr, key_type, seed).view(np.int32)
    if not pa.types.is_struct(arr.type) or arr.type.num_fields != len(types):
        raise ValueError(f"a composite key of {len(types)} columns is a struct array of them")
    for column, t in zip(arr.flatten(), types, strict=True):  # flatten: offset and nulls applied
        seed = _hash_column(column, t, seed)
    if arr.null_count:  # a null struct: none of its columns are hashed
        seed = np.where(arr.is_null().to_numpy(zero_copy_only=False), SPARK_HASH_SEED, seed)
    return seed.astype(np.uint32).view(np.int32)


def _hash_column(arr: pa.Array, key_type: str, seed: np.ndarray) -> np.ndarray:
    """Spark's hash of one column's values with per-row seeds, as uint32."""
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint32)
    if key_type in ("string", "binary"):
        target = pa.large_binary()
        arr = arr.cast(pa.large_string() if key_type == "string" else target).cast(target)
        _, offsets_buf, data_buf = arr.buffers()
        offsets = np.frombuffer(offsets_buf, np.int64, n + 1, arr.offset * 8)
        data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        out = _hash_bytes(offsets, data, seed)
    elif key_type == "int":
        # A checked cast: a value outside int32 raises instead of wrapping to another key's hash.
        out = _hash_int32(arr.cast(pa.int32()).fill_null(0).to_numpy(zero_copy_only=False), seed)
    else:  # bigint
        out = _hash_int64(arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), seed)
    if arr.null_count:
        out = np.where(arr.is_null().to_numpy(zero_copy_only=False), seed, out)
    return out


def key_groups(
    keys: pa.Array | list, key_type: KeyType, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> np.ndarray:
    """Key group of every key: ``pmod(hash(key), max_parallelism)`` as Spark SQL computes it."""
    check_parallelism(1, max_parallelism)
    h = spark_hash(keys, key_type).astype(np.int64)
    return np.mod(h, max_parallelism).astype(np.int32)


def key_group_of(
    key: str | bytes | int, key_type: str, max_parallelism: int = DEFAULT_MAX_PARALLELISM
) -> int:
    """Key group of one key (the scalar form of :func:`key_groups`)."""
    return int(key_groups([key], key_type, max_parallelism)[0])


def spark_key_group_sql(column: str, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> str:
    """The Spark SQL expression that computes :func:`key_groups` for ``column``."""
    check_parallelism(1, max_parallelism)
    quoted = column.replace("`", "``")
    return f"pmod(hash(`{quoted}`), {int(max_parallelism)})"
