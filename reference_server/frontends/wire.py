"""Tensor encodings shared by the HTTP and gRPC frontends (KServe v2, triton_spec §5.4-5.6).

Two encodings exist on the wire:

* **raw bytes** (HTTP binary tensor extension, gRPC ``raw_input_contents`` /
  ``raw_output_contents``): little-endian, row-major, no padding; BOOL is one byte; each BYTES
  element is a uint32 little-endian length followed by the bytes.
* **JSON** (HTTP ``data``): flat or nested lists of JSON values of the datatype's kind.

Inside the server a tensor is a numpy array of :data:`NUMPY_DTYPES` ``[datatype]``. Two
datatypes have no exact numpy counterpart: BYTES tensors are ``object`` arrays of ``bytes``, and
BF16 tensors carry their raw 16-bit patterns as ``uint16`` (the server never does arithmetic on
them; a backend that does must convert).

A third source is **system shared memory** (:mod:`reference_server.core.shm`): a tensor's raw
bytes lie in a region the client registered, and the request names the region with the
``shared_memory_region``, ``shared_memory_offset`` and ``shared_memory_byte_size`` parameters.
Each frontend reads those parameters with its protocol's type rules into a :class:`ShmReference`;
:func:`shm_input`, :func:`shm_output` and :func:`write_shm_output` do the rest for both.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference_server.core.errors import Code, ServerError
from reference_server.core.shm import RegionSlice, SharedMemoryRegistry
from reference_server.core.types import InferRequest

#: KServe datatype name -> numpy dtype of the in-server array (explicitly little-endian).
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
    "BYTES": np.dtype(object),
}

#: Datatypes that cannot travel as JSON (Triton refuses them in both directions).
JSON_UNSUPPORTED = frozenset({"FP16", "BF16"})

_INT_KINDS = frozenset("iu")
_U32 = struct.Struct("<I")


def element_count(shape: Sequence[int]) -> int:
    """Number of elements of a tensor of ``shape`` (1 for a scalar shape ``[]``)."""
    return math.prod(shape)


def from_raw(datatype: str, shape: Sequence[int], buffer: bytes | memoryview) -> np.ndarray:
    """Decode the raw wire bytes of one tensor.

    Args:
        datatype: KServe datatype name; must be a key of :data:`NUMPY_DTYPES`.
        shape: The tensor's full shape (non-negative dims).
        buffer: Exactly the tensor's bytes. Fixed-size types are viewed, not copied, so the
            returned array is read-only.

    Returns:
        The tensor as a numpy array of ``shape``.

    Raises:
        ValueError: ``buffer`` does not hold exactly one tensor of ``shape``; the message says
            which sizes disagree and the caller adds the input name.
    """
    count = element_count(shape)
    if datatype == "BYTES":
        return _bytes_from_raw(shape, count, buffer)
    dtype = NUMPY_DTYPES[datatype]
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise ValueError(f"Expected {expected}, got {len(buffer)}")
    if datatype == "BOOL":
        # Any non-zero byte is true; view as uint8 first so odd bytes cannot make invalid bools.
        return np.frombuffer(buffer, dtype=np.uint8).reshape(shape) != 0
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def _bytes_from_raw(shape: Sequence[int], count: int, buffer: bytes | memoryview) -> np.ndarray:
    view = memoryview(buffer)
    size = len(view)
    items: list[bytes] = []
    offset = 0
    while offset < size:
        if offset + 4 > size:
            raise ValueError("BYTES element has a truncated 4-byte length prefix")
        (length,) = _U32.unpack_from(view, offset)
        offset += 4
        if offset + length > size:
            raise ValueError(
                f"BYTES element {len(items)} declares {length} bytes, only {size - offset} remain"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if len(items) != count:
        raise ValueError(f"expected {count} BYTES elements, got {len(items)}")
    array = np.empty(count, dtype=object)
    array[:] = items
    return array.reshape(shape)


def to_raw(datatype: str, array: np.ndarray) -> bytes | memoryview:
    """Encode one tensor in the raw wire layout.

    Fixed-size types come back as a memoryview of a C-contiguous little-endian array, so a
    large output is not copied again before it is written to the socket.
    """
    if datatype == "BYTES":
        return _bytes_to_raw(array)
    dtype = NUMPY_DTYPES.get(datatype)
    if dtype is None:
        raise ServerError(f"unsupported datatype '{datatype}'", Code.INTERNAL)
    if datatype == "BOOL":
        data = np.ascontiguousarray(array, dtype=np.bool_).view(np.uint8)
    else:
        data = np.ascontiguousarray(array, dtype=dtype)
    if data.size == 0:
        return b""
    return data.reshape(-1).data.cast("B")


def _bytes_to_raw(array: np.ndarray) -> bytes:
    parts: list[bytes] = []
    for item in array.reshape(-1):
        data = as_bytes(item)
        parts.append(_U32.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def as_bytes(item: object) -> bytes:
    """One BYTES element as ``bytes`` (backends may hand back ``str`` or numpy scalars)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, np.bytes_ | bytearray | memoryview):
        return bytes(item)
    return str(item).encode("utf-8")


def from_json(name: str, datatype: str, shape: Sequence[int], data: Any) -> np.ndarray:
    """Decode the JSON ``data`` of one HTTP input (flat or nested lists, row-major).

    Args:
        name: The input's name, for error messages.
        datatype: KServe datatype name.
        shape: The input's declared shape.
        data: The parsed JSON value of its ``data`` field.

    Raises:
        ServerError: INTERNAL (HTTP 500) for JSON shape/type problems, as Triton's JSON parser
            reports them (spec §5.2); INVALID_ARG for FP16/BF16, which JSON cannot carry.
    """
    count = element_count(shape)
    if datatype in JSON_UNSUPPORTED:
        raise ServerError(
            f"receiving {datatype} data via JSON is not supported. "
            f"Please use the binary data format for input {name}",
            Code.INVALID_ARG,
        )
    if not isinstance(data, list):
        data = [data]
    if datatype == "BYTES":
        flat = _flatten(data)
        if len(flat) != count:
            raise _shape_mismatch()
        array = np.empty(count, dtype=object)
        for index, item in enumerate(flat):
            if not isinstance(item, str):
                raise ServerError(
                    "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
                    Code.INTERNAL,
                )
            array[index] = item.encode("utf-8")
        return array.reshape(shape)
    try:
        parsed = np.asarray(data)
    except ValueError:
        # Ragged nesting: numpy cannot make a rectangular array of it.
        parsed = np.asarray(_flatten(data))
    if parsed.size != count:
        raise _shape_mismatch()
    kind = parsed.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise _type_error("boolean", "boolean")
    elif datatype.startswith("INT"):
        if kind not in _INT_KINDS:
            raise _type_error("signed-integer", "signed-integer")
    elif datatype.startswith("UINT"):
        if kind not in _INT_KINDS:
            raise _type_error("unsigned-integer", "unsigned-integer")
    elif kind not in "iuf":
        raise _type_error("number", "double")
    dtype = NUMPY_DTYPES[datatype]
    if kind in _INT_KINDS and dtype.kind in _INT_KINDS:
        # Out-of-range JSON integers wrap silently in Triton; astype does the same.
        return parsed.astype(np.int64 if kind == "i" else np.uint64).astype(dtype).reshape(shape)
    return parsed.astype(dtype).reshape(shape)


def _flatten(data: list[Any]) -> list[Any]:
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= 100:
                    raise ServerError(
                        "Unable to parse 'data': nesting deeper than 100 levels", Code.INTERNAL
                    )
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _shape_mismatch() -> ServerError:
    return ServerError(
        "Unable to parse 'data': Shape does not match true shape of 'data' field", Code.INTERNAL
    )


def _type_error(kind: str, target: str) -> ServerError:
    # Triton's JSON helper wording, e.g. "attempt to access JSON non-number as double".
    return ServerError(
        f"Unable to parse 'data': attempt to access JSON non-{kind} as {target}",
        Code.INTERNAL,
    )


def to_json(name: str, datatype: str, array: np.ndarray) -> list[Any]:
    """Encode one output tensor as a flat JSON list (row-major).

    FP32 values become the double of the float (``0.1f`` -> ``0.10000000149011612``), as Triton
    writes them; BYTES elements become strings (invalid UTF-8 is replaced, since JSON needs text).

    Raises:
        ServerError: INVALID_ARG for FP16/BF16 outputs, which JSON cannot carry.
    """
    if datatype in JSON_UNSUPPORTED:
        raise ServerError(
            f"sending {datatype} data via JSON is not supported. "
            f"Please use the binary data format for output {name}",
            Code.INVALID_ARG,
        )
    if datatype == "BYTES":
        return [as_bytes(item).decode("utf-8", "replace") for item in array.reshape(-1)]
    values: list[Any] = array.reshape(-1).tolist()
    return values


@dataclass(frozen=True)
class ShmReference:
    """The shared-memory parameters of one input or requested output, as sent.

    Attributes:
        region: ``shared_memory_region``: the registered region's name.
        offset: ``shared_memory_offset``: bytes from the region's start (default 0).
        byte_size: ``shared_memory_byte_size``: bytes of the tensor (HTTP default 0, which no
            region accepts).
    """

    region: str
    offset: int = 0
    byte_size: int = 0


def shm_slice(registry: SharedMemoryRegistry | None, ref: ShmReference) -> RegionSlice:
    """The bounds-checked part of a registered region that ``ref`` names.

    Raises:
        ServerError: NOT_FOUND for an unknown region (every region is unknown without a
            registry), INVALID_ARG for an offset or size outside it.
    """
    if registry is None:
        raise ServerError(f"Unable to find shared memory region: '{ref.region}'", Code.NOT_FOUND)
    return registry.slice(ref.region, ref.offset, ref.byte_size)


def shm_input(
    registry: SharedMemoryRegistry | None,
    ref: ShmReference,
    datatype: str,
    shape: Sequence[int],
) -> np.ndarray:
    """Decode one input tensor from shared memory (raw layout, as :func:`from_raw`).

    Fixed-size tensors are read-only views of the client's memory, not copies.

    Raises:
        ServerError: the region cannot serve ``ref`` (see :func:`shm_slice`).
        ValueError: ``ref.byte_size`` is not the tensor's size; the caller words the mismatch.
    """
    return from_raw(datatype, shape, shm_slice(registry, ref).view())


def shm_output(registry: SharedMemoryRegistry | None, ref: ShmReference) -> RegionSlice:
    """Where a requested output goes: checked when the request is parsed, as Triton does."""
    return shm_slice(registry, ref)


def write_shm_output(name: str, datatype: str, array: np.ndarray, target: RegionSlice) -> None:
    """Write one output tensor's raw bytes to the start of ``target``.

    Raises:
        ServerError: INTERNAL (Triton's code) when the tensor does not fit.
    """
    raw = to_raw(datatype, array)
    if len(raw) > target.byte_size:
        raise ServerError(
            f"shared memory size specified with the request for output '{name}' "
            f"({target.byte_size} bytes) should be at least {len(raw)} bytes to hold the results",
            Code.INTERNAL,
        )
    target.write(raw)


def request_prefix(request: InferRequest) -> str:
    """How Triton starts a request's error message: ``[request id: <id>] ``."""
    return f"[request id: {request.id or '<id_unknown>'}] "


def size_mismatch(request: InferRequest, name: str, detail: object) -> ServerError:
    """Triton's error for an input whose bytes do not match its datatype and shape (one wording
    for HTTP and gRPC, tensor bytes and shared-memory regions alike)."""
    return ServerError(
        f"{request_prefix(request)}input byte size mismatch for input '{name}' for model "
        f"'{request.model_name}'. {detail}",
        Code.INVALID_ARG,
    )
