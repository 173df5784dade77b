"""The stored copy's encoding (state/file_codec.py): every byte comes back, damage is found."""

from __future__ import annotations

import os

import pytest

from state.file_codec import (
    NONE,
    ZSTD,
    UndecodableFileError,
    check_codec,
    decode_file,
    encode_file,
    file_checksum,
)


@pytest.fixture
def text_file(tmp_path):
    """9 MiB of hex text (more than two of the codec's chunks), which zstd halves."""
    path = tmp_path / "000012.sst"
    path.write_bytes(os.urandom(9 << 19).hex().encode())
    return path


def test_zstd_round_trip_keeps_every_byte_and_the_files_checksum(text_file, tmp_path):
    encoded, decoded = tmp_path / "enc", tmp_path / "dec"
    checksum = encode_file(text_file, encoded, ZSTD)
    assert checksum == file_checksum(text_file)
    assert encoded.stat().st_size < 0.6 * text_file.stat().st_size
    assert decode_file(encoded, decoded, ZSTD) == checksum
    assert decoded.read_bytes() == text_file.read_bytes()


def test_none_stores_the_file_as_it_is(text_file, tmp_path):
    assert encode_file(text_file, tmp_path / "unused", NONE) == file_checksum(text_file)
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize("damage", ["flipped", "truncated", "header"])
def test_a_damaged_frame_never_decodes_to_the_files_bytes(text_file, tmp_path, damage):
    encoded, decoded = tmp_path / "enc", tmp_path / "dec"
    checksum = encode_file(text_file, encoded, ZSTD)
    data = bytearray(encoded.read_bytes())
    if damage == "flipped":
        data[len(data) // 2] ^= 0x55
    elif damage == "truncated":
        del data[len(data) - 1000 :]
    else:
        data[0] ^= 0xFF
    encoded.write_bytes(bytes(data))
    try:
        got = decode_file(encoded, decoded, ZSTD)
    except UndecodableFileError as e:
        assert "not a valid zstd frame" in str(e)
    else:
        assert got != checksum


def test_an_unknown_codec_is_refused_naming_it():
    assert check_codec(ZSTD) == ZSTD
    with pytest.raises(
        ValueError, match=r"codec of 'x\.sst' must be one of none, zstd, got 'gzip'"
    ):
        check_codec("gzip", what="codec of 'x.sst'")
