"""KServe v2 HTTP inference bodies <-> core records (triton_spec §5.4-5.6), without sockets.

The HTTP frontend reads the body and headers and hands them here; everything that can be
decided from bytes alone (JSON shape, binary slicing, parameters, output selection, response
layout) lives in these pure functions so it is tested in milliseconds.

Status codes follow Triton >= 24.01: JSON syntax/type problems are INTERNAL (HTTP 500), semantic
problems INVALID_ARG (400). Messages are Triton's where the spec records them.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import numpy as np

from reference_server.batching.sequence import SequenceInfo, set_sequence
from reference_server.core.config import protocol_datatype
from reference_server.core.errors import Code, ServerError
from reference_server.core.shm import CUDA_IPC_HANDLE_SIZE, SharedMemoryRegistry
from reference_server.core.types import InferRequest, InferResponse, ParamValue, RequestedOutput
from reference_server.frontends import wire

#: Bytes that may follow the JSON header as binary tensors (gRPC's limit, INT32_MAX).
MAX_BINARY_SIZE = 2**31 - 1


_compact = json.JSONEncoder(separators=(",", ":"), allow_nan=True).encode


def dumps(value: Any) -> bytes:
    """Compact JSON (Triton writes no whitespace), UTF-8 encoded."""
    return _compact(value).encode("utf-8")


def error_body(message: str) -> bytes:
    """The ``{"error": ...}`` body of every HTTP error reply."""
    return dumps({"error": message})


def parse_header_length(value: str | None, body_length: int | None) -> int | None:
    """Validate ``Inference-Header-Content-Length`` against the body length.

    Returns:
        ``None`` when the header is absent (the whole body is JSON), otherwise the length.
    """
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise ServerError(
            f"Unable to parse Inference-Header-Content-Length, got: {value}", Code.INVALID_ARG
        ) from None
    if length < 0 or (body_length is not None and length > body_length):
        raise ServerError(
            f"inference header size should be in range (0, {body_length}), got: {length}",
            Code.INVALID_ARG,
        )
    return length


def parse_json(buffer: bytes | memoryview) -> Any:
    """Parse a request's JSON header with Triton's error wording (INTERNAL -> 500)."""
    try:
        return json.loads(bytes(buffer) if isinstance(buffer, memoryview) else buffer)
    except json.JSONDecodeError as exc:
        raise ServerError(
            f"failed to parse the request JSON buffer: {exc.msg} at {exc.pos}", Code.INTERNAL
        ) from None
    except UnicodeDecodeError as exc:
        raise ServerError(
            f"failed to parse the request JSON buffer: Invalid encoding in string. at {exc.start}",
            Code.INTERNAL,
        ) from None


def parse_infer_request(
    model_name: str,
    model_version: str,
    header: Any,
    binary: memoryview,
    *,
    has_header_length: bool,
    shared_memory: SharedMemoryRegistry | None = None,
) -> InferRequest:
    """Build the core request from a parsed JSON header and the binary bytes after it.

    Args:
        model_name: From the URL (a ``model_name`` in the body is ignored, as in Triton).
        model_version: From the URL; ``""`` means the latest ready version.
        header: The parsed JSON object.
        binary: The body bytes after the JSON header (empty for a pure-JSON request).
        has_header_length: Whether ``Inference-Header-Content-Length`` was sent; binary inputs
            are only valid with it.
        shared_memory: The server's registered regions, for inputs and outputs that name one
            (``None``: every region is unknown).

    Raises:
        ServerError: With Triton's code and message for any malformed or inconsistent request.
    """
    if not isinstance(header, dict):
        raise _json_type("inputs", "object")
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise _json_type("id", "string")
    request = InferRequest(model_name=model_name, model_version=model_version, id=request_id)
    parameters = header.get("parameters")
    if parameters is not None:
        _parse_parameters(request, parameters)

    if "inputs" not in header:
        raise ServerError(
            "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'",
            Code.INTERNAL,
        )
    inputs = header["inputs"]
    if not isinstance(inputs, list):
        raise _json_type("inputs", "array")
    offset = 0
    for entry in inputs:
        offset = _parse_input(request, entry, binary, offset, has_header_length, shared_memory)
    if offset != len(binary):
        raise ServerError(
            f"unexpected additional input data for model '{model_name}'", Code.INVALID_ARG
        )

    outputs = header.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise _json_type("outputs", "array")
        request.requested_outputs = [_parse_output(entry, shared_memory) for entry in outputs]
    return request


def _parse_parameters(request: InferRequest, parameters: Any) -> None:
    if not isinstance(parameters, dict):
        raise _json_type("parameters", "object")
    sequence: dict[str, Any] = {}
    for key, value in parameters.items():
        if key.startswith("triton_"):
            raise ServerError(
                "parameter keys starting with 'triton_' are reserved for Triton usage and "
                "should not be specified.",
                Code.INVALID_ARG,
            )
        if key == "sequence_id":
            # A string names a string sequence; anything else must be a uint64.
            sequence["correlation_id"] = value if isinstance(value, str) else _uint(key, value)
        elif key in ("sequence_start", "sequence_end"):
            sequence[key.removeprefix("sequence_")] = _bool(key, value)
        elif key == "priority":
            request.priority = _uint(key, value)
        elif key == "timeout":
            request.timeout_us = _uint(key, value)
        elif key == "binary_data_output":
            request.binary_data_output = _bool(key, value)
        elif isinstance(value, str | bool | int | float):
            request.parameters[key] = value
        else:
            raise ServerError(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                "'string'.",
                Code.INVALID_ARG,
            )
    if sequence:
        set_sequence(request, SequenceInfo(**sequence))


def _parse_input(
    request: InferRequest,
    entry: Any,
    binary: memoryview,
    offset: int,
    has_header_length: bool,
    shared_memory: SharedMemoryRegistry | None,
) -> int:
    if not isinstance(entry, dict):
        # Triton 2.51 reads a non-object entry as an input with no data (checked).
        raise ServerError(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But no field is set",
            Code.INVALID_ARG,
        )
    name = entry.get("name")
    if not isinstance(name, str):
        raise _json_type("name", "string")
    datatype = entry.get("datatype")
    if not isinstance(datatype, str):
        raise _json_type("datatype", "string")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(dim, int) and not isinstance(dim, bool) and 0 <= dim < 2**64 for dim in shape
    ):
        raise ServerError(
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer",
            Code.INTERNAL,
        )
    if datatype not in wire.NUMPY_DTYPES:
        raise ServerError(
            f"{wire.request_prefix(request)}inference input '{name}' data-type is '{datatype}', which is "
            "not a KServe datatype",
            Code.INVALID_ARG,
        )
    params = entry.get("parameters") or {}
    if not isinstance(params, dict):
        raise _json_type("parameters", "object")
    binary_size = params.get("binary_data_size")
    region = params.get("shared_memory_region")
    has_data = "data" in entry
    given = [has_data, binary_size is not None, region is not None]
    if sum(given) > 1 or (sum(given) == 0 and wire.element_count(shape) > 0):
        raise ServerError(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'. But "
            + _which_set(has_data, binary_size is not None, region is not None),
            Code.INVALID_ARG,
        )
    if region is not None:
        try:
            array = wire.shm_input(shared_memory, _shm_reference(params), datatype, shape)
        except ValueError as exc:
            raise wire.size_mismatch(request, name, exc) from None
    elif binary_size is not None:
        if not has_header_length:
            raise ServerError(
                "must specify valid 'Infer-Header-Content-Length' in request header and "
                "'binary_data_size' when passing inputs in binary data format",
                Code.INVALID_ARG,
            )
        size = _uint("binary_data_size", binary_size)
        if offset + size > len(binary):
            missing = offset + size - len(binary)  # Triton reports the shortfall
            raise ServerError(
                f"unexpected size for input '{name}', expecting {missing} additional bytes for "
                f"model '{request.model_name}'",
                Code.INVALID_ARG,
            )
        try:
            array = wire.from_raw(datatype, shape, binary[offset : offset + size])
        except ValueError as exc:
            raise wire.size_mismatch(request, name, exc) from None
        offset += size
    elif has_data:
        array = wire.from_json(name, datatype, shape, entry["data"])
    else:
        array = np.empty(shape, dtype=wire.NUMPY_DTYPES[datatype])
    request.inputs[name] = array
    request.input_datatypes[name] = datatype
    return offset


def _parse_output(entry: Any, shared_memory: SharedMemoryRegistry | None) -> RequestedOutput:
    if not isinstance(entry, dict):
        raise _json_type("outputs", "object")
    name = entry.get("name")
    if not isinstance(name, str):
        raise _json_type("name", "string")
    params = entry.get("parameters") or {}
    if not isinstance(params, dict):
        raise _json_type("parameters", "object")
    binary = _bool("binary_data", params.get("binary_data", False))
    if "shared_memory_region" in params:
        # Classification is computed from the output, so it cannot go to shared memory.
        if "classification" in params:
            raise ServerError(
                "Output can't set both 'shared_memory_region' and 'classification'",
                Code.INVALID_ARG,
            )
        if binary:
            raise ServerError(
                "Output can't set both 'shared_memory_region' and 'binary_data'",
                Code.INVALID_ARG,
            )
        target = wire.shm_output(shared_memory, _shm_reference(params))
        return RequestedOutput(name=name, shared_memory=target)
    class_count = params.get("classification", 0)
    return RequestedOutput(
        name=name,
        binary_data=binary,
        class_count=_uint("classification", class_count),
    )


def _shm_reference(params: dict[str, Any]) -> wire.ShmReference:
    """The shared-memory parameters of an input or output, with Triton's JSON type rules."""
    region = params["shared_memory_region"]
    if not isinstance(region, str):
        raise _json_type("shared_memory_region", "string")
    return wire.ShmReference(
        region=region,
        offset=_uint("shared_memory_offset", params.get("shared_memory_offset", 0)),
        byte_size=_uint("shared_memory_byte_size", params.get("shared_memory_byte_size", 0)),
    )


def parse_raw_request(
    model_name: str, model_version: str, body: bytes | memoryview, config: Any
) -> InferRequest:
    """Build the request for a raw binary body (``Inference-Header-Content-Length: 0``).

    The body is the bytes of the model's only input; its shape is deduced from the config
    (``[1] + dims`` when the model batches), and every output is returned binary.

    Args:
        model_name: From the URL.
        model_version: From the URL.
        body: The whole request body.
        config: The model's normalized ``ModelConfig`` protobuf.
    """
    inputs = list(config.input)
    if len(inputs) != 1:
        raise ServerError(
            "Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(inputs)} inputs in '{model_name}' model configuration",
            Code.INVALID_ARG,
        )
    spec = inputs[0]
    datatype = protocol_datatype(spec.data_type)
    dims = list(spec.dims)
    request = InferRequest(
        model_name=model_name, model_version=model_version, binary_data_output=True
    )
    if datatype == "BYTES":
        if dims != [1]:
            raise ServerError(
                f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]",
                Code.INVALID_ARG,
            )
        array = np.empty(1, dtype=object)
        array[0] = bytes(body)
    else:
        if dims.count(-1) > 1:
            raise ServerError(
                f"The shape of the raw input '{spec.name}' can not be deduced because there "
                "are more than one variable-sized dimension",
                Code.INVALID_ARG,
            )
        itemsize = wire.NUMPY_DTYPES[datatype].itemsize
        fixed = itemsize * int(np.prod([d for d in dims if d != -1], dtype=np.int64))
        if -1 in dims and fixed > 0:
            dims[dims.index(-1)] = len(body) // fixed
        try:
            array = wire.from_raw(datatype, dims, body)
        except ValueError as exc:
            raise ServerError(
                f"{wire.request_prefix(request)}input byte size mismatch for input '{spec.name}' for model "
                f"'{model_name}'. {exc}",
                Code.INVALID_ARG,
            ) from None
    if config.max_batch_size > 0:
        array = array.reshape([1, *array.shape])
    request.inputs[spec.name] = array
    request.input_datatypes[spec.name] = datatype
    return request


def render_infer_response(
    request: InferRequest, response: InferResponse
) -> tuple[list[bytes | memoryview], int | None]:
    """Lay out the HTTP reply of one successful inference.

    Returns:
        The body parts (JSON header first, then binary outputs in output order) and the JSON
        header length when the body carries binary data (the value of
        ``Inference-Header-Content-Length``), else ``None``.
    """
    requested = {output.name: output for output in request.requested_outputs}
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for name, array in response.outputs.items():
        datatype = response.output_datatypes[name]
        wanted = requested.get(name)
        # Request-level binary_data_output does not apply to explicitly listed outputs.
        binary = wanted.binary_data if wanted is not None else request.binary_data_output
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if wanted is not None and wanted.shared_memory is not None:
            # Triton's reply names the tensor and nothing else: the data is in the region.
            wire.write_shm_output(name, datatype, array, wanted.shared_memory)
        elif binary:
            raw = wire.to_raw(datatype, array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            if len(raw):
                blobs.append(raw)
        else:
            entry["data"] = wire.to_json(name, datatype, array)
        outputs.append(entry)
    body: dict[str, Any] = {}
    if response.id:
        body["id"] = response.id
    body["model_name"] = response.model_name
    body["model_version"] = response.model_version
    if response.parameters:
        body["parameters"] = {k: parameter_value(v) for k, v in response.parameters.items()}
    body["outputs"] = outputs
    header = dumps(body)
    if not blobs:
        return [header], None
    return [header, *blobs], len(header)


def parse_shm_register(body: Any) -> tuple[str, int, int]:
    """``(key, offset, byte_size)`` of a system shared-memory register body, Triton's checks.

    Missing fields are INVALID_ARG (400); fields of the wrong JSON type INTERNAL (500), with
    rapidjson's words and no field name, as Triton 2.51 answers.
    """
    if not isinstance(body, dict) or "key" not in body:
        raise ServerError("Shared memory register request has no 'key' field", Code.INVALID_ARG)
    key = body["key"]
    if not isinstance(key, str):
        raise ServerError("attempt to access JSON non-string as string", Code.INTERNAL)
    offset = _bare_uint(body.get("offset", 0))
    if "byte_size" not in body:
        raise ServerError(
            "Shared memory register request has no 'byte_size' field", Code.INVALID_ARG
        )
    return key, offset, _bare_uint(body["byte_size"])


def parse_cuda_shm_register(body: Any) -> tuple[bytes, int, int]:
    """``(raw_handle, byte_size, device_id)`` of a CUDA shared-memory register body.

    Checked as Triton checks it before it tries to open the handle: ``raw_handle.b64`` must
    decode to a 64-byte ``cudaIpcMemHandle_t``.
    """
    if not isinstance(body, dict) or "raw_handle" not in body:
        raise ServerError(
            "Shared memory register request has no 'raw_handle' field", Code.INVALID_ARG
        )
    b64 = _member(body["raw_handle"], "b64")
    if not isinstance(b64, str):
        raise ServerError("attempt to access JSON non-string as string", Code.INTERNAL)
    byte_size = _bare_uint(_member(body, "byte_size"))
    device_id = _bare_uint(_member(body, "device_id"))
    try:
        handle = base64.b64decode(b64)
    except (binascii.Error, ValueError):
        handle = b""
    if len(handle) != CUDA_IPC_HANDLE_SIZE:
        raise ServerError(
            "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t", Code.INVALID_ARG
        )
    return handle, byte_size, device_id


def _member(value: Any, key: str) -> Any:
    if not isinstance(value, dict) or key not in value:
        raise ServerError(f"attempt to access non-existing object member '{key}'", Code.INTERNAL)
    return value[key]


def _bare_uint(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ServerError(
            "attempt to access JSON non-unsigned-integer as unsigned-integer", Code.INTERNAL
        )
    return value


def _uint(key: str, value: Any) -> int:
    # rapidjson's uint64: a number beyond 2**64 - 1 is not an unsigned integer to Triton.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ServerError(
            f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer",
            Code.INTERNAL,
        )
    return value


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ServerError(
            f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean",
            Code.INTERNAL,
        )
    return value


def _json_type(key: str, expected: str) -> ServerError:
    return ServerError(
        f"Unable to parse '{key}': attempt to access JSON non-{expected} as {expected}",
        Code.INTERNAL,
    )


def _which_set(data: bool, binary: bool, region: bool) -> str:
    # Triton's wording: "But set 'data' 'binary_data_size'".
    names = [
        label
        for flag, label in (
            (data, "'data'"),
            (binary, "'binary_data_size'"),
            (region, "'shared_memory_region'"),
        )
        if flag
    ]
    if not names:
        return "no field is set"
    return "set " + " ".join(names)


def parameter_value(value: ParamValue) -> ParamValue:
    """A response parameter as JSON can carry it (numpy scalars become Python values)."""
    if isinstance(value, np.generic):
        converted: ParamValue = value.item()
        return converted
    return value
