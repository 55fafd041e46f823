"""Tensor encodings of the frontends: raw wire bytes and JSON ``data`` (triton_spec §5.4-5.6)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference_server.core.errors import Code, ServerError
from reference_server.frontends import wire

FIXED = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"]
FIXED += ["FP16", "FP32", "FP64", "BF16"]


@pytest.mark.parametrize("datatype", FIXED)
def test_raw_round_trip_fixed_size(datatype: str) -> None:
    dtype = wire.NUMPY_DTYPES[datatype]
    array = (np.arange(12) % 2 == 1) if datatype == "BOOL" else np.arange(12).astype(dtype)
    array = array.reshape(3, 4)
    raw = bytes(wire.to_raw(datatype, array))
    assert len(raw) == 12 * dtype.itemsize
    back = wire.from_raw(datatype, [3, 4], raw)
    assert back.dtype == dtype
    np.testing.assert_array_equal(back, array)


def test_raw_layout_is_little_endian_row_major() -> None:
    array = np.array([[1, 2], [3, 256]], dtype=np.int32)
    assert bytes(wire.to_raw("INT32", array)) == struct.pack("<4i", 1, 2, 3, 256)
    # A big-endian array still goes out little-endian.
    assert bytes(wire.to_raw("INT32", array.astype(">i4"))) == struct.pack("<4i", 1, 2, 3, 256)
    # Non-contiguous (transposed) arrays are written in logical row-major order.
    assert bytes(wire.to_raw("INT32", array.T)) == struct.pack("<4i", 1, 3, 2, 256)


def test_bool_raw_any_nonzero_byte_is_true() -> None:
    assert wire.from_raw("BOOL", [3], b"\x00\x01\x07").tolist() == [False, True, True]
    assert bytes(wire.to_raw("BOOL", np.array([True, False]))) == b"\x01\x00"


def test_bytes_raw_round_trip_with_length_prefixes() -> None:
    items = [b"", b"a", "ü".encode(), b"\x00\xff" * 300]
    array = np.empty(4, dtype=object)
    array[:] = items
    raw = bytes(wire.to_raw("BYTES", array.reshape(2, 2)))
    assert raw[:4] == struct.pack("<I", 0)
    assert raw[4:9] == struct.pack("<I", 1) + b"a"
    back = wire.from_raw("BYTES", [2, 2], raw)
    assert back.shape == (2, 2)
    assert back.reshape(-1).tolist() == items


def test_bytes_to_raw_accepts_str_elements() -> None:
    array = np.array(["hé", b"x"], dtype=object)
    assert bytes(wire.to_raw("BYTES", array)) == b"\x03\x00\x00\x00h\xc3\xa9\x01\x00\x00\x00x"


@pytest.mark.parametrize(
    ("shape", "raw", "message"),
    [
        ([2], b"\x01\x00\x00\x00a\x01\x00", "truncated"),
        ([1], b"\x05\x00\x00\x00abc", "declares 5 bytes"),
        ([3], b"\x01\x00\x00\x00a\x00\x00\x00\x00", "expected 3 BYTES elements, got 2"),
    ],
)
def test_bytes_raw_errors(shape: list[int], raw: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        wire.from_raw("BYTES", shape, raw)


def test_fixed_raw_size_mismatch_names_both_sizes() -> None:
    with pytest.raises(ValueError, match="Expected 64, got 60"):
        wire.from_raw("FP32", [1, 16], b"\x00" * 60)


@given(
    st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), min_size=0, max_size=40),
)
def test_int32_raw_round_trip_property(values: list[int]) -> None:
    array = np.array(values, dtype=np.int32)
    back = wire.from_raw("INT32", [len(values)], bytes(wire.to_raw("INT32", array)))
    assert back.tolist() == values


@given(st.lists(st.binary(max_size=20), min_size=0, max_size=10))
def test_bytes_raw_round_trip_property(values: list[bytes]) -> None:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    back = wire.from_raw("BYTES", [len(values)], bytes(wire.to_raw("BYTES", array)))
    assert back.tolist() == values


def test_json_nested_and_flat_data_are_the_same_tensor() -> None:
    flat = wire.from_json("x", "INT32", [2, 3], [1, 2, 3, 4, 5, 6])
    nested = wire.from_json("x", "INT32", [2, 3], [[1, 2, 3], [4, 5, 6]])
    assert flat.dtype == np.int32
    np.testing.assert_array_equal(flat, nested)
    np.testing.assert_array_equal(flat, np.arange(1, 7).reshape(2, 3))


def test_json_ragged_nesting_counts_elements() -> None:
    ragged = wire.from_json("x", "FP32", [4], [[1.0], [2.0, 3.0], 4.0])
    assert ragged.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_json_element_count_mismatch_is_internal_500() -> None:
    with pytest.raises(ServerError) as info:
        wire.from_json("x", "FP32", [1, 4], [1.0, 2.0, 3.0])
    assert info.value.code is Code.INTERNAL
    assert "Shape does not match true shape of 'data' field" in info.value.message


@pytest.mark.parametrize(
    ("datatype", "data"),
    [("INT32", [1.5, 2.0]), ("BOOL", [1, 0]), ("FP32", [True, False]), ("UINT8", ["a", "b"])],
)
def test_json_wrong_kind_is_internal_500(datatype: str, data: list[object]) -> None:
    with pytest.raises(ServerError) as info:
        wire.from_json("x", datatype, [2], data)
    assert info.value.code is Code.INTERNAL
    assert info.value.code.http_status == 500


def test_json_fp32_accepts_integers_and_nan() -> None:
    array = wire.from_json("x", "FP32", [3], [1, 2.5, float("nan")])
    assert array.dtype == np.float32
    assert array[:2].tolist() == [1.0, 2.5]
    assert np.isnan(array[2])


def test_json_out_of_range_integers_wrap() -> None:
    assert wire.from_json("x", "INT8", [2], [127, 128]).tolist() == [127, -128]
    assert wire.from_json("x", "UINT8", [1], [257]).tolist() == [1]


def test_json_bytes_strings_become_utf8_bytes() -> None:
    array = wire.from_json("x", "BYTES", [2], ["hé", ""])
    assert array.dtype == object
    assert array.tolist() == ["hé".encode(), b""]
    with pytest.raises(ServerError, match="non-string"):
        wire.from_json("x", "BYTES", [1], [3])


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_json_half_floats_are_refused_both_ways(datatype: str) -> None:
    with pytest.raises(ServerError) as info:
        wire.from_json("in0", datatype, [1], [1.0])
    assert info.value.code is Code.INVALID_ARG
    assert info.value.message == (
        f"receiving {datatype} data via JSON is not supported. "
        "Please use the binary data format for input in0"
    )
    with pytest.raises(ServerError, match="binary data format for output out0"):
        wire.to_json("out0", datatype, np.zeros(1, dtype=np.float16))


def test_json_output_fp32_is_the_double_of_the_float() -> None:
    data = wire.to_json("y", "FP32", np.array([[0.1, 1.0]], dtype=np.float32))
    assert data == [0.10000000149011612, 1.0]
    assert wire.to_json("y", "BOOL", np.array([True, False])) == [True, False]
    assert wire.to_json("y", "BYTES", np.array([b"ab", b"\xff"], dtype=object)) == ["ab", "\ufffd"]
