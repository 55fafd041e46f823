"""HTTP inference bodies <-> core records, without sockets (triton_spec §5.4-5.5, §11 E)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from reference_server.core.errors import Code, ServerError
from reference_server.core.types import InferRequest, InferResponse, RequestedOutput
from reference_server.frontends import http_codec

EMPTY = memoryview(b"")


def parse(header: object, binary: bytes = b"", *, has_length: bool = True) -> InferRequest:
    return http_codec.parse_infer_request(
        "m", "", header, memoryview(binary), has_header_length=has_length
    )


def error_of(header: object, binary: bytes = b"", *, has_length: bool = True) -> ServerError:
    with pytest.raises(ServerError) as info:
        parse(header, binary, has_length=has_length)
    return info.value


# -- Inference-Header-Content-Length -------------------------------------------------------------


def test_header_length_absent_means_pure_json() -> None:
    assert http_codec.parse_header_length(None, 10) is None
    assert http_codec.parse_header_length("0", 10) == 0
    assert http_codec.parse_header_length("10", 10) == 10


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("11", "inference header size should be in range (0, 10), got: 11"),
        ("-1", "inference header size should be in range (0, 10), got: -1"),
        ("abc", "Unable to parse Inference-Header-Content-Length, got: abc"),
    ],
)
def test_header_length_lies_are_400(value: str, message: str) -> None:
    with pytest.raises(ServerError) as info:
        http_codec.parse_header_length(value, 10)
    assert info.value.code is Code.INVALID_ARG
    assert info.value.message == message


def test_malformed_json_is_500_with_tritons_wording() -> None:
    with pytest.raises(ServerError) as info:
        http_codec.parse_json(b'{"inputs": [')
    assert info.value.code is Code.INTERNAL
    assert info.value.message.startswith("failed to parse the request JSON buffer: ")


# -- request parsing --------------------------------------------------------------------------


def test_binary_inputs_are_sliced_in_input_order_around_a_json_input() -> None:
    a = np.arange(4, dtype=np.float32)
    b = np.array([7, 8], dtype=np.int64)
    header = {
        "id": "r1",
        "inputs": [
            {
                "name": "A",
                "shape": [1, 4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 16},
            },
            {"name": "J", "shape": [2], "datatype": "INT32", "data": [[5], [6]]},
            {
                "name": "B",
                "shape": [2],
                "datatype": "INT64",
                "parameters": {"binary_data_size": 16},
            },
        ],
    }
    request = parse(header, a.tobytes() + b.tobytes())
    assert request.id == "r1"
    assert list(request.inputs) == ["A", "J", "B"]
    np.testing.assert_array_equal(request.inputs["A"], a.reshape(1, 4))
    np.testing.assert_array_equal(request.inputs["J"], [5, 6])
    np.testing.assert_array_equal(request.inputs["B"], b)
    assert request.input_datatypes == {"A": "FP32", "J": "INT32", "B": "INT64"}


def _binary_input(size: int) -> dict[str, object]:
    return {
        "inputs": [
            {
                "name": "A",
                "shape": [2],
                "datatype": "FP32",
                "parameters": {"binary_data_size": size},
            }
        ]
    }


def test_binary_too_few_bytes_is_400_naming_the_shortfall() -> None:
    error = error_of(_binary_input(8), b"\x00" * 4)
    assert error.code is Code.INVALID_ARG
    assert (
        error.message == "unexpected size for input 'A', expecting 4 additional bytes for model 'm'"
    )


def test_binary_extra_bytes_is_400() -> None:
    error = error_of(_binary_input(8), b"\x00" * 12)
    assert error.message == "unexpected additional input data for model 'm'"


def test_binary_without_header_length_is_400() -> None:
    error = error_of(_binary_input(8), has_length=False)
    assert error.code is Code.INVALID_ARG
    assert "must specify valid 'Infer-Header-Content-Length'" in error.message


def test_binary_size_not_matching_shape_is_a_byte_size_mismatch() -> None:
    error = error_of(_binary_input(4), b"\x00" * 4)
    assert error.code is Code.INVALID_ARG
    assert error.message == (
        "[request id: <id_unknown>] input byte size mismatch for input 'A' for model 'm'. "
        "Expected 8, got 4"
    )


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "A", "shape": [1], "datatype": "FP32"},
        {
            "name": "A",
            "shape": [1],
            "datatype": "FP32",
            "data": [1.0],
            "parameters": {"binary_data_size": 4},
        },
    ],
)
def test_exactly_one_data_source_per_input(entry: dict[str, object]) -> None:
    error = error_of({"inputs": [entry]}, b"\x00" * 4)
    assert error.code is Code.INVALID_ARG
    assert error.message.startswith(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But"
    )


def test_zero_element_input_needs_no_data() -> None:
    request = parse({"inputs": [{"name": "A", "shape": [0, 3], "datatype": "FP32"}]})
    assert request.inputs["A"].shape == (0, 3)


@pytest.mark.parametrize(
    ("header", "fragment"),
    [
        ({}, "Unable to parse 'inputs'"),
        ({"inputs": {}}, "Unable to parse 'inputs'"),
        ({"id": 5, "inputs": []}, "Unable to parse 'id'"),
        ({"inputs": [{"name": "A", "shape": [-1], "datatype": "FP32", "data": []}]}, "'shape'"),
        ([1, 2], "Unable to parse"),
    ],
)
def test_json_shape_problems_are_500(header: object, fragment: str) -> None:
    error = error_of(header)
    assert error.code is Code.INTERNAL
    assert fragment in error.message


def test_parameters_priority_timeout_and_custom_values() -> None:
    request = parse(
        {
            "parameters": {
                "priority": 2,
                "timeout": 5000,
                "binary_data_output": True,
                "sequence_id": 7,
                "flag": True,
                "count": 3,
                "ratio": 0.5,
                "label": "x",
            },
            "inputs": [],
        }
    )
    assert request.priority == 2
    assert request.timeout_us == 5000
    assert request.binary_data_output is True
    assert request.parameters == {"flag": True, "count": 3, "ratio": 0.5, "label": "x"}
    assert type(request.parameters["flag"]) is bool


def test_triton_prefixed_parameter_is_400() -> None:
    error = error_of({"parameters": {"triton_x": 1}, "inputs": []})
    assert error.code is Code.INVALID_ARG
    assert "reserved for Triton usage" in error.message


def test_negative_priority_is_a_json_type_error() -> None:
    assert error_of({"parameters": {"priority": -1}, "inputs": []}).code is Code.INTERNAL


def test_requested_outputs() -> None:
    request = parse(
        {
            "inputs": [],
            "outputs": [
                {"name": "o1", "parameters": {"binary_data": True}},
                {"name": "o2", "parameters": {"classification": 3}},
                {"name": "o3"},
            ],
        }
    )
    assert request.requested_outputs == [
        RequestedOutput("o1", binary_data=True),
        RequestedOutput("o2", class_count=3),
        RequestedOutput("o3"),
    ]


# -- raw binary requests (header length 0) ----------------------------------------------------


def _config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_raw_request_deduces_batch_one_and_variable_dim() -> None:
    config = _config(
        'name: "m" max_batch_size: 8 input { name: "IN" data_type: TYPE_FP32 dims: [2, -1] }'
    )
    body = np.arange(6, dtype=np.float32).tobytes()
    request = http_codec.parse_raw_request("m", "", body, config)
    assert request.inputs["IN"].shape == (1, 2, 3)
    assert request.input_datatypes == {"IN": "FP32"}
    assert request.binary_data_output is True


def test_raw_request_bytes_input_gets_one_element() -> None:
    config = _config('name: "m" input { name: "S" data_type: TYPE_STRING dims: [1] }')
    request = http_codec.parse_raw_request("m", "", b"hello", config)
    assert request.inputs["S"].tolist() == [b"hello"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            'name: "m" input { name: "A" data_type: TYPE_FP32 dims: [1] } '
            'input { name: "B" data_type: TYPE_FP32 dims: [1] }',
            "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs",
        ),
        (
            'name: "m" input { name: "A" data_type: TYPE_FP32 dims: [-1, -1] }',
            "more than one variable-sized dimension",
        ),
        (
            'name: "m" input { name: "A" data_type: TYPE_STRING dims: [2] }',
            "the model must have input shape [1]",
        ),
    ],
)
def test_raw_request_errors(text: str, fragment: str) -> None:
    with pytest.raises(ServerError) as info:
        http_codec.parse_raw_request("m", "", b"\x00" * 8, _config(text))
    assert info.value.code is Code.INVALID_ARG
    assert fragment in info.value.message


# -- response rendering -----------------------------------------------------------------------


def _response(request_id: str = "") -> InferResponse:
    return InferResponse(
        model_name="m",
        model_version="1",
        id=request_id,
        outputs={
            "a": np.array([[0.1, 2.0]], dtype=np.float32),
            "b": np.array([1, 2, 3], dtype=np.int32),
            "e": np.zeros((1, 0), dtype=np.float32),
        },
        output_datatypes={"a": "FP32", "b": "INT32", "e": "FP32"},
    )


def _split(parts: list[bytes | memoryview], length: int | None) -> tuple[dict, bytes]:
    body = b"".join(bytes(p) for p in parts)
    if length is None:
        return json.loads(body), b""
    return json.loads(body[:length]), body[length:]


def test_render_all_json_by_default_and_no_id_when_empty() -> None:
    request = InferRequest(model_name="m")
    parts, length = http_codec.render_infer_response(request, _response())
    assert length is None
    body = b"".join(bytes(p) for p in parts)
    assert b" " not in body  # compact JSON, like Triton
    header, _ = _split(parts, length)
    assert list(header) == ["model_name", "model_version", "outputs"]
    assert header["model_version"] == "1"
    assert header["outputs"][0] == {
        "name": "a",
        "datatype": "FP32",
        "shape": [1, 2],
        "data": [0.10000000149011612, 2.0],
    }


def test_render_binary_data_output_and_zero_size_outputs() -> None:
    request = InferRequest(model_name="m", binary_data_output=True)
    parts, length = http_codec.render_infer_response(request, _response("x"))
    header, binary = _split(parts, length)
    assert length == len(http_codec.dumps(header))
    assert header["id"] == "x"
    sizes = [o["parameters"]["binary_data_size"] for o in header["outputs"]]
    assert sizes == [8, 12, 0]
    assert binary == np.array([0.1, 2.0], np.float32).tobytes() + struct.pack("<3i", 1, 2, 3)


def test_explicit_outputs_ignore_request_level_binary_flag() -> None:
    request = InferRequest(
        model_name="m",
        binary_data_output=True,
        requested_outputs=[RequestedOutput("b"), RequestedOutput("a", binary_data=True)],
    )
    parts, length = http_codec.render_infer_response(request, _response())
    header, binary = _split(parts, length)
    by_name = {o["name"]: o for o in header["outputs"]}
    assert by_name["b"]["data"] == [1, 2, 3]
    assert by_name["a"]["parameters"] == {"binary_data_size": 8}
    assert len(binary) == 8


def test_only_empty_binary_outputs_means_plain_json() -> None:
    response = InferResponse(
        model_name="m",
        model_version="1",
        id="",
        outputs={"e": np.zeros(0, dtype=np.float32)},
        output_datatypes={"e": "FP32"},
    )
    request = InferRequest(model_name="m", binary_data_output=True)
    parts, length = http_codec.render_infer_response(request, response)
    assert length is None
    assert json.loads(parts[0])["outputs"][0]["parameters"] == {"binary_data_size": 0}


def test_fp16_output_as_json_is_refused() -> None:
    response = InferResponse(
        model_name="m",
        model_version="1",
        id="",
        outputs={"h": np.zeros(2, dtype=np.float16)},
        output_datatypes={"h": "FP16"},
    )
    with pytest.raises(ServerError) as info:
        http_codec.render_infer_response(InferRequest(model_name="m"), response)
    assert info.value.code is Code.INVALID_ARG


def test_error_body_is_compact() -> None:
    assert http_codec.error_body("Not Found") == b'{"error":"Not Found"}'
