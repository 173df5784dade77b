"""Key groups: Flink's range assignment, and ``spark_hash`` being exactly Spark SQL's ``hash()``.

The unit tests check the vectorised Murmur3 against a plain scalar reference written from the
algorithm. The ``spark`` test is the ground truth: it asks Spark itself for ``hash(k)`` and
``pmod(hash(k), M)`` over edge cases and a few thousand seeded random keys per key type.
"""

from __future__ import annotations

import itertools
import os
import random
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.deploy.java_check import JavaMissingError, parse_java_version, require_java
from state import keygroups as kg

ROOT = Path(__file__).resolve().parents[1]
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_PARALLELISMS = (1, 7, 128, 32768)

# --- a scalar reference of Spark's Murmur3_x86_32 (hashInt, hashLong, legacy hashUnsafeBytes) ---

_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k1: int) -> int:
    return (_rotl((k1 * 0xCC9E2D51) & _M32, 15) * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    return h1 ^ (h1 >> 16)


def _to_int32(x: int) -> int:
    return x - (1 << 32) if x >= 1 << 31 else x


def ref_hash(value: str | bytes | int | None, key_type: str) -> int:
    h1 = kg.SPARK_HASH_SEED
    if value is None:
        return h1
    if key_type == "int":
        return _to_int32(_fmix(_mix_h1(h1, _mix_k1(value & _M32)), 4))
    if key_type == "bigint":
        h1 = _mix_h1(h1, _mix_k1(value & _M32))
        h1 = _mix_h1(h1, _mix_k1((value >> 32) & _M32))
        return _to_int32(_fmix(h1, 8))
    data = value.encode("utf-8") if isinstance(value, str) else value
    aligned = len(data) - len(data) % 4
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i : i + 4], "little")))
    for byte in data[aligned:]:  # one at a time, as a signed Java byte widened to int
        h1 = _mix_h1(h1, _mix_k1((byte - 256 if byte >= 128 else byte) & _M32))
    return _to_int32(_fmix(h1, len(data)))


# --- key-group ranges --------------------------------------------------------------------------

RANGE_CASES = [(1, 1), (1, 128), (2, 128), (3, 128), (7, 10), (127, 128), (128, 128), (5, 32768)]


def _check_ranges(parallelism: int, max_parallelism: int) -> None:
    ranges = [kg.key_group_range(i, parallelism, max_parallelism) for i in range(parallelism)]
    assert ranges[0].start == 0
    assert ranges[-1].end == max_parallelism - 1
    for left, right in itertools.pairwise(ranges):
        assert right.start == left.end + 1  # contiguous, no gap, no overlap
    sizes = [len(r) for r in ranges]
    assert sum(sizes) == max_parallelism
    assert min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1  # Flink spreads key groups evenly
    owner = np.repeat(np.arange(parallelism), sizes)
    vectorised = kg.subtask_for_key_group(np.arange(max_parallelism), parallelism, max_parallelism)
    np.testing.assert_array_equal(vectorised, owner)
    for key_group in {0, max_parallelism - 1, max_parallelism // 2}:
        subtask = kg.subtask_for_key_group(key_group, parallelism, max_parallelism)
        assert isinstance(subtask, int)
        assert key_group in ranges[subtask]


@pytest.mark.parametrize(("parallelism", "max_parallelism"), RANGE_CASES)
def test_ranges_cover_every_key_group_once(parallelism: int, max_parallelism: int) -> None:
    _check_ranges(parallelism, max_parallelism)
    covered = [
        g for i in range(parallelism) for g in kg.key_group_range(i, parallelism, max_parallelism)
    ]
    assert covered == list(range(max_parallelism))
    for key_group in range(max_parallelism):
        subtask = kg.subtask_for_key_group(key_group, parallelism, max_parallelism)
        assert key_group in kg.key_group_range(subtask, parallelism, max_parallelism)


@settings(deadline=None)
@given(
    st.integers(1, kg.MAX_MAX_PARALLELISM).flatmap(
        lambda m: st.tuples(st.integers(1, min(m, 300)) | st.integers(1, m), st.just(m))
    )
)
def test_ranges_property(case: tuple[int, int]) -> None:
    _check_ranges(*case)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: kg.check_parallelism(0, 128), "parallelism"),
        (lambda: kg.check_parallelism(-1, 128), "parallelism"),
        (lambda: kg.check_parallelism(129, 128), "parallelism"),
        (lambda: kg.check_parallelism(1, 0), "max_parallelism"),
        (lambda: kg.check_parallelism(1, kg.MAX_MAX_PARALLELISM + 1), "max_parallelism"),
        (lambda: kg.key_group_range(0, 0, 128), "parallelism"),
        (lambda: kg.key_group_range(0, 4, 2), "parallelism"),
        (lambda: kg.key_group_range(4, 4, 128), "subtask"),
        (lambda: kg.key_group_range(-1, 4, 128), "subtask"),
        (lambda: kg.subtask_for_key_group(0, 0, 128), "parallelism"),
        (lambda: kg.subtask_for_key_group(128, 4, 128), "key_group"),
        (lambda: kg.subtask_for_key_group(np.array([0, -1]), 4, 128), "key_group"),
        (lambda: kg.key_groups(["a"], "string", 0), "max_parallelism"),
        (lambda: kg.spark_key_group_sql("k", 0), "max_parallelism"),
        (lambda: kg.spark_hash(["a"], "double"), "key_type"),
        (lambda: kg.spark_hash([], "double"), "key_type"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_field(call, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        call()


def test_subtask_for_key_group_does_not_overflow_narrow_dtypes() -> None:
    narrow = np.arange(kg.MAX_MAX_PARALLELISM, dtype=np.int16)  # 0..32767 fits, x1000 would not
    expected = narrow.astype(np.int64) * 1000 // kg.MAX_MAX_PARALLELISM
    np.testing.assert_array_equal(
        kg.subtask_for_key_group(narrow, 1000, kg.MAX_MAX_PARALLELISM), expected
    )


def test_key_group_range_value_semantics() -> None:
    r = kg.KeyGroupRange(3, 5)
    assert len(r) == 3 and list(r) == [3, 4, 5]
    assert 3 in r and 5 in r and 2 not in r and 6 not in r
    assert np.int64(4) in r and np.int32(4) in r  # elements of key_groups() arrays
    assert "4" not in r and 4.0 not in r and True not in kg.KeyGroupRange(0, 1)
    assert kg.KeyGroupRange.from_list(r.to_list()) == r
    empty = kg.KeyGroupRange(5, 4)
    assert len(empty) == 0 and list(empty) == [] and 5 not in empty


# --- spark_hash against the scalar reference ---------------------------------------------------


def _assert_same(values, ours, theirs, what: str) -> None:
    ours = np.asarray(ours, np.int64)
    theirs = np.asarray(theirs, np.int64)
    assert ours.shape == theirs.shape, what
    bad = np.flatnonzero(ours != theirs)
    examples = ", ".join(f"{values[i]!r}: ours {ours[i]} vs {theirs[i]}" for i in bad[:5])
    assert bad.size == 0, f"{what}: {bad.size} of {len(values)} differ, e.g. {examples}"


# Lone surrogates are not valid UTF-8; Spark strings never hold them.
_UTF8_CHARS = st.characters(exclude_categories=("Cs",))


@settings(deadline=None)
@given(st.lists(st.none() | st.binary(max_size=40), max_size=60))
def test_binary_hash_matches_reference(values: list[bytes | None]) -> None:
    ours = kg.spark_hash(values, "binary")
    assert ours.dtype == np.int32
    _assert_same(values, ours, [ref_hash(v, "binary") for v in values], "binary")


@settings(deadline=None)
@given(st.lists(st.none() | st.text(_UTF8_CHARS, max_size=20), max_size=60))
def test_string_hash_is_hash_of_utf8_bytes(values: list[str | None]) -> None:
    ours = kg.spark_hash(values, "string")
    encoded = [None if v is None else v.encode("utf-8") for v in values]
    _assert_same(values, ours, kg.spark_hash(encoded, "binary"), "string vs binary")
    _assert_same(values, ours, [ref_hash(v, "string") for v in values], "string")


@settings(deadline=None)
@given(st.lists(st.none() | st.integers(INT32_MIN, INT32_MAX), max_size=60))
def test_int_hash_matches_reference(values: list[int | None]) -> None:
    _assert_same(values, kg.spark_hash(values, "int"), [ref_hash(v, "int") for v in values], "int")


@settings(deadline=None)
@given(st.lists(st.none() | st.integers(INT64_MIN, INT64_MAX), max_size=60))
def test_bigint_hash_matches_reference(values: list[int | None]) -> None:
    ours = kg.spark_hash(values, "bigint")
    _assert_same(values, ours, [ref_hash(v, "bigint") for v in values], "bigint")


@settings(deadline=None)
@given(
    st.lists(st.none() | st.binary(max_size=20), min_size=1, max_size=40),
    st.data(),
)
def test_sliced_and_chunked_arrays_hash_like_lists(values, data) -> None:
    start = data.draw(st.integers(0, len(values)))
    stop = data.draw(st.integers(start, len(values)))
    expected = kg.spark_hash(values[start:stop], "binary") if stop > start else np.zeros(0)
    sliced = pa.array(values, pa.binary())[start:stop]
    _assert_same(values[start:stop], kg.spark_hash(sliced, "binary"), expected, "sliced")
    chunked = pa.chunked_array([pa.array(values[:start], pa.binary()), sliced], pa.binary())
    whole = kg.spark_hash(values[:start] + values[start:stop], "binary")
    _assert_same(values, kg.spark_hash(chunked, "binary"), whole, "chunked")


@settings(deadline=None)
@given(
    st.lists(st.none() | st.integers(INT64_MIN, INT64_MAX), max_size=40),
    st.integers(1, kg.MAX_MAX_PARALLELISM),
)
def test_key_groups_are_pmod_of_hash(values: list[int | None], max_parallelism: int) -> None:
    groups = kg.key_groups(values, "bigint", max_parallelism)
    assert groups.dtype == np.int32
    expected = [ref_hash(v, "bigint") % max_parallelism for v in values]  # Python % is pmod
    _assert_same(values, groups, expected, "key groups")
    if values:
        assert kg.key_group_of(values[0], "bigint", max_parallelism) == expected[0]


def test_hash_edge_cases_without_spark() -> None:
    for key_type in kg.KEY_TYPES:
        assert kg.spark_hash([], key_type).dtype == np.int32
        assert kg.spark_hash([None, None], key_type).tolist() == [42, 42]
    with pytest.raises(pa.ArrowInvalid):
        kg.spark_hash([INT32_MAX + 1], "int")  # a checked cast, not a silent wrap
    long_key = "k" * 10_001
    keys = [long_key, "", "ab", None, long_key[:5]]
    _assert_same(keys, kg.spark_hash(keys, "string"), [ref_hash(k, "string") for k in keys], "mix")


def test_spark_key_group_sql() -> None:
    assert kg.spark_key_group_sql("key", 128) == "pmod(hash(`key`), 128)"
    assert kg.spark_key_group_sql("a`b", 7) == "pmod(hash(`a``b`), 7)"


# --- the ground truth: Spark itself ------------------------------------------------------------


_CHAR_RANGES = [
    (0x20, 0x7E),  # ASCII: 1 byte
    (0x80, 0x7FF),  # Latin-1 supplement, Greek, Cyrillic, ...: 2 bytes (0xC2 0x80 ...)
    (0x3040, 0x30FF),  # kana: 3 bytes
    (0x4E00, 0x9FFF),  # CJK: 3 bytes
    (0x1F300, 0x1FAFF),  # emoji: 4 bytes
]


def _random_text(rng: random.Random) -> str:
    chars = []
    for _ in range(rng.randint(0, 20)):
        low, high = rng.choice(_CHAR_RANGES)
        chars.append(chr(rng.randint(low, high)))
    return "".join(chars)


def _string_keys(rng: random.Random) -> list[str | None]:
    fixed: list[str | None] = [None, "", "ü", "日本", "😀", "\x7f", "\x80", "ÿ", "é" * 7, "Spark"]
    fixed += ["abcdefghijklm"[:n] for n in range(1, 14)]  # 1..13 bytes: every tail length
    for n in range(13):  # a multibyte char after n ASCII bytes: high bytes at every tail slot
        fixed += ["x" * n + c for c in ("ü", "日", "😀", "\u0080")]
    fixed.append("長い" * 500)
    return fixed + [_random_text(rng) for _ in range(3000)]


def _binary_keys(rng: random.Random) -> list[bytes | None]:
    fixed: list[bytes | None] = [None, b""]
    for n in range(1, 14):
        fixed += [bytes(range(n)), b"\xff" * n, b"\x80" * n, b"\x00" * n, b"\x7f" * n]
        fixed.append(bytes(range(0x80, 0x80 + n)))
    fixed.append(bytes(range(256)) * 4)
    return fixed + [rng.randbytes(rng.randint(0, 40)) for _ in range(3000)]


def _int_keys(rng: random.Random) -> list[int | None]:
    fixed = [None, 0, 1, -1, 42, -42, INT32_MIN, INT32_MAX, INT32_MIN + 1, INT32_MAX - 1, 1 << 16]
    return fixed + [rng.randint(INT32_MIN, INT32_MAX) for _ in range(3000)]


def _bigint_keys(rng: random.Random) -> list[int | None]:
    fixed = [None, 0, 1, -1, 42, INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1]
    fixed += [INT32_MIN, INT32_MAX, INT32_MIN - 1, INT32_MAX + 1, 0xFFFFFFFF, 1 << 32, -(1 << 32)]
    return fixed + [rng.randint(INT64_MIN, INT64_MAX) for _ in range(3000)]


KEY_CASES = {
    "string": (_string_keys, pa.string()),
    "binary": (_binary_keys, pa.binary()),
    "int": (_int_keys, pa.int32()),
    "bigint": (_bigint_keys, pa.int64()),
}


class _SparkTypes(dict):
    """Spark SQL types by key type, imported when a Spark test first asks."""

    def __missing__(self, key_type: str):
        from pyspark.sql import types as T

        self.update(
            string=T.StringType(), binary=T.BinaryType(), int=T.IntegerType(), bigint=T.LongType()
        )
        return self[key_type]


SPARK_TYPES = _SparkTypes()


@pytest.mark.spark
@pytest.mark.parametrize("key_type", list(KEY_CASES))
def test_spark_hash_and_key_groups_match_spark(spark, key_type: str) -> None:
    from pyspark.sql.types import StructField, StructType

    make_keys, arrow_type = KEY_CASES[key_type]
    keys = make_keys(random.Random(f"cutline-keygroups-{key_type}"))
    schema = StructType(
        [StructField("i", SPARK_TYPES["int"], False), StructField("k", SPARK_TYPES[key_type], True)]
    )
    df = spark.createDataFrame(list(enumerate(keys)), schema)
    group_columns = [f"{kg.spark_key_group_sql('k', m)} AS kg_{m}" for m in MAX_PARALLELISMS]
    rows = sorted(df.selectExpr("i", "hash(k) AS h", *group_columns).collect())
    assert [row["i"] for row in rows] == list(range(len(keys)))

    arrow_keys = pa.array(keys, arrow_type)
    _assert_same(keys, kg.spark_hash(arrow_keys, key_type), [r["h"] for r in rows], "hash")
    _assert_same(keys, kg.spark_hash(keys, key_type), [r["h"] for r in rows], "hash of list")
    for m in MAX_PARALLELISMS:
        spark_groups = [r[f"kg_{m}"] for r in rows]
        _assert_same(keys, kg.key_groups(arrow_keys, key_type, m), spark_groups, f"kg M={m}")
    # The scalar reference agrees with Spark too, so the unit tests above test the real thing.
    _assert_same(keys, [ref_hash(k, key_type) for k in keys], [r["h"] for r in rows], "reference")


@pytest.mark.spark
@pytest.mark.parametrize("types", [("string", "bigint"), ("int", "binary", "string")])
def test_composite_keys_hash_like_spark_hash_of_a_struct(spark, types: tuple[str, ...]) -> None:
    """A composite key hashes as Spark's ``hash(struct(a, b))``, which is ``hash(a, b)``: the
    routing (spark_key_group_sql over the struct the sources build) and the state layer agree,
    nulls in any column included."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    rng = random.Random(f"cutline-composite-{'-'.join(types)}")
    names = [f"c{i}" for i in range(len(types))]
    values = []
    for t in types:
        column = KEY_CASES[t][0](rng)[:1200]
        rng.shuffle(column)
        values.append(column)
    n = min(len(v) for v in values)
    rows_in = [(i, *(v[i] for v in values)) for i in range(n)]
    schema = StructType(
        [StructField("i", SPARK_TYPES["int"], False)]
        + [StructField(c, SPARK_TYPES[t], True) for c, t in zip(names, types, strict=True)]
    )
    df = spark.createDataFrame(rows_in, schema).withColumn("k", F.struct(*names))
    rows = sorted(
        df.select(
            "i",
            F.hash("k").alias("struct_hash"),
            F.hash(*names).alias("hash"),
            F.expr(kg.spark_key_group_sql("k", 128)).alias("kg"),
        ).collect()
    )
    keys = pa.StructArray.from_arrays(
        [pa.array(v[:n], KEY_CASES[t][1]) for v, t in zip(values, types, strict=True)],
        names,
    )
    ours = kg.spark_hash(keys, types)
    assert ours.tolist() == [r["struct_hash"] for r in rows] == [r["hash"] for r in rows]
    assert kg.key_groups(keys, types, 128).tolist() == [r["kg"] for r in rows]


# --- Java ----------------------------------------------------------------------------------------


def test_java_check_cli_succeeds_here() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "spark_jobs.deploy.java_check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert require_java() in proc.stdout


def _fake_java(directory: Path, version_line: str) -> Path:
    """A JAVA_HOME whose bin/java prints ``version_line`` to stderr like `java -version`."""
    java = directory / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory


def test_require_java_rejects_java_11(monkeypatch, tmp_path: Path) -> None:
    java_home = _fake_java(tmp_path / "jdk-11", 'openjdk version "11.0.2" 2019-01-15')
    monkeypatch.setenv("JAVA_HOME", str(java_home))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(JavaMissingError) as info:
        require_java()
    message = str(info.value)
    assert "11.0.2" in message
    assert str(java_home) in message
    assert "Java 17+" in message and "Spark 4" in message
    assert "apt-get install openjdk-17-jre-headless" in message and "JAVA_HOME" in message


def test_require_java_accepts_a_newer_fake_java(monkeypatch, tmp_path: Path) -> None:
    java_home = _fake_java(tmp_path / "jdk-21", 'openjdk version "21.0.1" 2023-10-17')
    monkeypatch.setenv("JAVA_HOME", str(java_home))
    assert require_java() == "21.0.1"
    with pytest.raises(JavaMissingError, match="Java 22"):
        require_java(min_major=22)


def test_require_java_without_any_java(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaMissingError, match=r"No `java` found.*Java 17\+"):
        require_java()
    # A JAVA_HOME without bin/java is what Spark would use, so it fails even with java on PATH.
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", os.defpath)
    with pytest.raises(JavaMissingError, match="JAVA_HOME="):
        require_java()


def test_java_check_cli_fails_with_old_java(tmp_path: Path) -> None:
    java_home = _fake_java(tmp_path / "jdk-8", 'java version "1.8.0_301"')
    env = {**os.environ, "JAVA_HOME": str(java_home), "PATH": str(tmp_path / "empty")}
    proc = subprocess.run(
        [sys.executable, "-m", "spark_jobs.deploy.java_check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "1.8.0_301" in proc.stderr and "Java 17+" in proc.stderr


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', ("17.0.15", 17)),
        ('java version "1.8.0_301"', ("1.8.0_301", 8)),
        ('openjdk version "21-ea" 2023-09-19', ("21-ea", 21)),
        ('Picked up JAVA_TOOL_OPTIONS: -Xmx1g\nopenjdk version "11.0.2"', ("11.0.2", 11)),
    ],
)
def test_parse_java_version(output: str, expected: tuple[str, int]) -> None:
    assert parse_java_version(output) == expected


def test_parse_java_version_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="no version"):
        parse_java_version("bash: java: command not found")
