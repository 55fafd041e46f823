"""The system shared-memory extension, driven by the real ``tritonclient`` over HTTP and gRPC.

Regions are POSIX shared memory created with ``tritonclient.utils.shared_memory``; every test's
segments are unlinked and its regions unregistered when it ends, also when it fails. Expected
codes and words are Triton 2.51's (``tests/differential/test_shm_vs_triton.py`` runs the same
calls against it).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from reference_server import ServerThread
from reference_server.core.errors import ServerError
from reference_server.core.shm import SharedMemoryRegistry
from tests.server.conftest import DATATYPES, error_message, raw_request

Segment = Any  # tritonclient's SharedMemoryRegion handle
MakeSegment = Callable[[int], tuple[str, Segment]]

DATA = np.arange(16, dtype=np.float32).reshape(1, 16)


@pytest.fixture
def segment() -> Iterator[MakeSegment]:
    """Factory of fresh shared-memory segments: ``make(size) -> (key, handle)``; all unlinked."""
    made: list[Segment] = []

    def make(size: int) -> tuple[str, Segment]:
        key = f"/perfsweep_test_{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key[1:], key, size, create_only=True)
        made.append(handle)
        return key, handle

    try:
        yield make
    finally:
        for handle in made:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: ServerThread) -> Iterator[Any]:
    """A tritonclient of either protocol; every region is unregistered afterwards."""
    if request.param == "http":
        made: Any = httpclient.InferenceServerClient(server.http_url)
    else:
        made = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        yield made
    finally:
        made.unregister_system_shared_memory()
        made.close()


def _module(client: Any) -> Any:
    return grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient


def _error(call: Callable[[], Any]) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    status = str(info.value.status())
    return status.removeprefix("StatusCode."), info.value.message()


def _status(client: Any, name: str = "") -> list[dict[str, Any]]:
    """The status as HTTP's JSON list (gRPC's map of regions turned into the same shape)."""
    if _module(client) is httpclient:
        result: list[dict[str, Any]] = client.get_system_shared_memory_status(name)
        return result
    reply = client.get_system_shared_memory_status(name, as_json=True)
    return [
        {
            "name": entry.get("name", ""),
            "key": entry.get("key", ""),
            "offset": int(entry.get("offset", 0)),
            "byte_size": int(entry.get("byte_size", 0)),
        }
        for entry in reply.get("regions", {}).values()
    ]


def _code(client: Any, http: str, grpc_code: str) -> str:
    return http if _module(client) is httpclient else grpc_code


# -- register / status / unregister ---------------------------------------------------------


def test_server_metadata_lists_the_extension(server: ServerThread) -> None:
    meta = httpclient.InferenceServerClient(server.http_url).get_server_metadata()
    assert "system_shared_memory" in meta["extensions"]
    assert "cuda_shared_memory" not in meta["extensions"]


def test_register_status_unregister(client: Any, segment: MakeSegment) -> None:
    key_a, _ = segment(4096)
    key_b, _ = segment(8192)
    assert _status(client) == []
    client.register_system_shared_memory("a", key_a, 4096)
    client.register_system_shared_memory("b", key_b, 64, offset=4096)
    # Two regions on one key (Triton 2.51 fails this with a reused closed descriptor).
    client.register_system_shared_memory("b2", key_b, 128)
    regions = {entry["name"]: entry for entry in _status(client)}
    assert regions == {
        "a": {"name": "a", "key": key_a, "offset": 0, "byte_size": 4096},
        "b": {"name": "b", "key": key_b, "offset": 4096, "byte_size": 64},
        "b2": {"name": "b2", "key": key_b, "offset": 0, "byte_size": 128},
    }
    assert _status(client, "b") == [regions["b"]]
    assert _error(lambda: _status(client, "nope")) == (
        _code(client, "404", "NOT_FOUND"),
        "Unable to find system shared memory region: 'nope'",
    )
    client.unregister_system_shared_memory("b")
    client.unregister_system_shared_memory("never-registered")  # not an error, as in Triton
    assert sorted(entry["name"] for entry in _status(client)) == ["a", "b2"]
    client.unregister_system_shared_memory()
    assert _status(client) == []


def test_register_errors(client: Any, segment: MakeSegment) -> None:
    key, _ = segment(8192)
    client.register_system_shared_memory("r", key, 64)
    assert _error(lambda: client.register_system_shared_memory("r", key, 64)) == (
        _code(client, "400", "ALREADY_EXISTS"),
        "shared memory region 'r' already in manager",
    )
    missing = f"/perfsweep_test_missing_{uuid.uuid4().hex[:8]}"
    assert _error(lambda: client.register_system_shared_memory("x", missing, 64)) == (
        _code(client, "500", "INTERNAL"),
        f"Unable to open shared memory region: '{missing}'",
    )
    outside = (
        _code(client, "400", "INVALID_ARGUMENT"),
        "failed to register shared memory region 'x': invalid args",
    )
    assert _error(lambda: client.register_system_shared_memory("x", key, 9000)) == outside
    assert _error(lambda: client.register_system_shared_memory("x", key, 64, offset=8190)) == (
        outside
    )
    unaligned = (
        _code(client, "400", "INVALID_ARGUMENT"),
        "failed to register shared memory region 'x': unable to process address spaceInvalid "
        "argument",
    )
    assert _error(lambda: client.register_system_shared_memory("x", key, 64, offset=128)) == (
        unaligned
    )
    assert _error(lambda: client.register_system_shared_memory("x", key, 0)) == unaligned
    assert [entry["name"] for entry in _status(client)] == ["r"]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("region/q/register", {"byte_size": 8}, 400, "Shared memory register request has no 'key' field"),
        ("region/q/register", [1], 400, "Shared memory register request has no 'key' field"),
        ("region/q/register", {"key": "/k"}, 400, "Shared memory register request has no 'byte_size' field"),
        ("region/q/register", {"key": 5, "byte_size": 8}, 500, "attempt to access JSON non-string as string"),
        ("region/q/register", {"key": "/k", "byte_size": -4}, 500, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ("region/q/register", {"key": "/k", "byte_size": 8, "offset": "x"}, 500, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ("region/q/register", None, 500, "failed to parse the request JSON buffer: The document is empty. at 0"),
        ("register", {"key": "/k", "byte_size": 8}, 400, "'region name' is necessary to register system shared memory region"),
        ("region/q/status", None, 404, "Unable to find system shared memory region: 'q'"),
    ],
)  # fmt: skip
def test_http_register_bodies(
    server: ServerThread, path: str, body: object, status: int, message: str
) -> None:
    method = "GET" if path.endswith("status") else "POST"
    data = b"" if body is None else json.dumps(body).encode()
    got, _, reply = raw_request(server.http_url, method, f"/v2/systemsharedmemory/{path}", data)
    assert (got, error_message(reply)) == (status, message)


def test_http_methods(server: ServerThread) -> None:
    url = server.http_url
    assert raw_request(url, "POST", "/v2/systemsharedmemory/status", b"")[0] == 405
    assert raw_request(url, "GET", "/v2/systemsharedmemory/region/q/register")[0] == 405
    assert raw_request(url, "GET", "/v2/systemsharedmemory/unregister")[0] == 405
    assert raw_request(url, "POST", "/v2/systemsharedmemory/region/q/unregister", b"")[0] == 200
    assert raw_request(url, "GET", "/v2/systemsharedmemory/region/q/nothing")[0] == 404


# -- inference --------------------------------------------------------------------------------


def _infer(
    client: Any,
    *,
    model: str = "identity_fp32",
    in_region: str = "in",
    in_size: int = 64,
    in_offset: int = 0,
    out_region: str | None = "out",
    out_size: int = 64,
    out_offset: int = 0,
) -> Any:
    module = _module(client)
    tensor = module.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_shared_memory(in_region, in_size, offset=in_offset)
    outputs = None
    if out_region is not None:
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(out_region, out_size, offset=out_offset)
        outputs = [output]
    return client.infer(model, [tensor], outputs=outputs)


@pytest.fixture
def regions(client: Any, segment: MakeSegment) -> tuple[Segment, Segment]:
    """``in`` (4096 bytes: DATA at 0, 2 * DATA at 64) and ``out`` (64 bytes), registered."""
    key_in, handle_in = segment(4096)
    key_out, handle_out = segment(64)
    shm.set_shared_memory_region(handle_in, [DATA])
    shm.set_shared_memory_region(handle_in, [DATA * 2], offset=64)
    client.register_system_shared_memory("in", key_in, 4096)
    client.register_system_shared_memory("out", key_out, 64)
    return handle_in, handle_out


def test_inference_from_and_into_regions(client: Any, regions: tuple[Segment, Segment]) -> None:
    _, handle_out = regions
    result = _infer(client)
    assert np.array_equal(shm.get_contents_as_numpy(handle_out, np.float32, [1, 16]), DATA)
    # The reply names the output and carries no data (Triton's reply); gRPC keeps an empty
    # raw entry in its place.
    if _module(client) is httpclient:
        assert result.get_response()["outputs"] == [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}
        ]
    else:
        reply = result.get_response()
        assert list(reply.raw_output_contents) == [b""]
        assert not reply.outputs[0].parameters
    _infer(client, in_offset=64)
    assert np.array_equal(shm.get_contents_as_numpy(handle_out, np.float32, [1, 16]), DATA * 2)
    # An input from shared memory with the output in the reply.
    plain = _infer(client, out_region=None)
    assert np.array_equal(plain.as_numpy("OUTPUT0"), DATA)
    # A larger output region is fine; the output takes its first bytes.
    assert _infer(client, out_region="in", out_size=128, out_offset=1024) is not None


def test_inference_errors(client: Any, regions: tuple[Segment, Segment]) -> None:
    invalid = _code(client, "400", "INVALID_ARGUMENT")
    prefix = "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
    assert _error(lambda: _infer(client, in_size=32)) == (
        invalid,
        prefix + "'identity_fp32'. Expected 64, got 32",
    )
    assert _error(lambda: _infer(client, in_size=128)) == (
        invalid,
        prefix + "'identity_fp32'. Expected 64, got 128",
    )
    assert _error(lambda: _infer(client, out_size=32)) == (
        _code(client, "500", "INTERNAL"),
        "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should "
        "be at least 64 bytes to hold the results",
    )
    not_found = _code(client, "404", "NOT_FOUND")
    assert _error(lambda: _infer(client, in_region="nope")) == (
        not_found,
        "Unable to find shared memory region: 'nope'",
    )
    assert _error(lambda: _infer(client, out_region="nope")) == (
        not_found,
        "Unable to find shared memory region: 'nope'",
    )
    assert _error(lambda: _infer(client, in_offset=5000)) == (
        invalid,
        "Invalid offset for shared memory region: 'in'",
    )
    assert _error(lambda: _infer(client, in_offset=4090)) == (
        invalid,
        "Invalid offset + byte size for shared memory region: 'in'",
    )
    assert _error(lambda: _infer(client, out_offset=32, out_size=64)) == (
        invalid,
        "Invalid offset + byte size for shared memory region: 'out'",
    )


def test_region_registered_over_http_serves_grpc(
    server: ServerThread, segment: MakeSegment
) -> None:
    key, handle = segment(64)
    shm.set_shared_memory_region(handle, [DATA])
    http = httpclient.InferenceServerClient(server.http_url)
    try:
        http.register_system_shared_memory("shared", key, 64)
        with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
            result = _infer(grpc_client, in_region="shared", out_region=None)
        assert np.array_equal(result.as_numpy("OUTPUT0"), DATA)
    finally:
        http.unregister_system_shared_memory()
        http.close()


def _raw_values(datatype: str) -> bytes:
    """Three elements of ``datatype`` in Triton's raw layout."""
    if datatype == "BYTES":
        return bytes(serialize_byte_tensor(np.array([b"ab", b"", b"xyz"], dtype=object)).item())
    if datatype == "BOOL":
        return np.array([True, False, True]).tobytes()
    if datatype == "BF16":
        return np.array([0x3F80, 0x4000, 0xBF80], dtype="<u2").tobytes()  # 1, 2, -1
    dtype = {"FP16": "<f2", "FP32": "<f4", "FP64": "<f8"}.get(datatype) or datatype.lower()
    return np.array([0, 1, 7], dtype=dtype).tobytes()


def test_every_datatype_round_trips(client: Any, segment: MakeSegment) -> None:
    """All 14 inputs of ``all_types`` read from one region, all outputs written to another."""
    key_in, handle_in = segment(4096)
    key_out, handle_out = segment(4096)
    client.register_system_shared_memory("typed_in", key_in, 4096)
    client.register_system_shared_memory("typed_out", key_out, 4096)
    module = _module(client)
    tensors, outputs, expected = [], [], {}
    for index, datatype in enumerate(DATATYPES):
        raw = _raw_values(datatype)
        offset = index * 128
        shm.set_shared_memory_region(handle_in, [np.frombuffer(raw, dtype=np.uint8)], offset)
        tensor = module.InferInput(f"IN_{datatype}", [3], datatype)
        tensor.set_shared_memory("typed_in", len(raw), offset=offset)
        tensors.append(tensor)
        output = module.InferRequestedOutput(f"OUT_{datatype}")
        output.set_shared_memory("typed_out", 128, offset=offset)
        outputs.append(output)
        expected[datatype] = (offset, raw)
    client.infer("all_types", tensors, outputs=outputs)
    for datatype, (offset, raw) in expected.items():
        back = shm.get_contents_as_numpy(handle_out, np.uint8, [len(raw)], offset=offset)
        assert back.tobytes() == raw, datatype


# -- protocol-specific parameter checks -----------------------------------------------------


def _shm_input(**parameters: Any) -> dict[str, Any]:
    return {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": parameters}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"inputs": [{**_shm_input(shared_memory_region="in", shared_memory_byte_size=64), "data": [1.0] * 16}]}, 400,
         "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
         "'shared_memory_region' in 'parameters'. But set 'data' 'shared_memory_region'"),
        ({"inputs": [_shm_input(shared_memory_region="in", shared_memory_byte_size=64, binary_data_size=64)]}, 400,
         "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
         "'shared_memory_region' in 'parameters'. But set 'binary_data_size' 'shared_memory_region'"),
        ({"inputs": [_shm_input(shared_memory_region="in")]}, 400,
         "Invalid offset + byte size for shared memory region: 'in'"),
        ({"inputs": [_shm_input(shared_memory_region=5, shared_memory_byte_size=64)]}, 500,
         "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string"),
        ({"inputs": [_shm_input(shared_memory_region="in", shared_memory_byte_size="64")]}, 500,
         "Unable to parse 'shared_memory_byte_size': attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"inputs": [_shm_input(shared_memory_region="in", shared_memory_byte_size=64, shared_memory_offset=-1)]}, 500,
         "Unable to parse 'shared_memory_offset': attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"inputs": [_shm_input(shared_memory_region="in", shared_memory_byte_size=64)],
          "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 64, "binary_data": True}}]}, 400,
         "Output can't set both 'shared_memory_region' and 'binary_data'"),
        ({"inputs": [_shm_input(shared_memory_region="in", shared_memory_byte_size=64)],
          "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 64, "classification": 2}}]}, 400,
         "Output can't set both 'shared_memory_region' and 'classification'"),
    ],
)  # fmt: skip
def test_http_parameter_errors(
    server: ServerThread, segment: MakeSegment, body: dict[str, Any], status: int, message: str
) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    key_in, _ = segment(4096)
    key_out, _ = segment(64)
    try:
        client.register_system_shared_memory("in", key_in, 4096)
        client.register_system_shared_memory("out", key_out, 64)
        got, _, reply = raw_request(
            server.http_url,
            "POST",
            "/v2/models/identity_fp32/infer",
            json.dumps(body).encode(),
        )
        assert (got, error_message(reply)) == (status, message)
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_http_output_byte_size_without_region_is_ignored(
    server: ServerThread, segment: MakeSegment
) -> None:
    key, handle = segment(64)
    shm.set_shared_memory_region(handle, [DATA])
    client = httpclient.InferenceServerClient(server.http_url)
    body = {
        "inputs": [_shm_input(shared_memory_region="in", shared_memory_byte_size=64)],
        "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_byte_size": 64}}],
    }
    try:
        client.register_system_shared_memory("in", key, 64)
        status, _, reply = raw_request(
            server.http_url, "POST", "/v2/models/identity_fp32/infer", json.dumps(body).encode()
        )
    finally:
        client.unregister_system_shared_memory()
        client.close()
    assert status == 200
    assert json.loads(reply)["outputs"][0]["data"] == DATA.reshape(-1).tolist()


def _grpc_request(**parameters: pb.InferParameter) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    for key, value in parameters.items():
        tensor.parameters[key].CopyFrom(value)
    return request


def _p(**value: Any) -> pb.InferParameter:
    return pb.InferParameter(**value)


@pytest.mark.parametrize(
    ("parameters", "contents", "message"),
    [
        ({"shared_memory_region": _p(string_param="in"), "shared_memory_byte_size": _p(int64_param=64)}, True,
         "unexpected 'content' provided when using shared memory for input tensor 'INPUT0' for model 'identity_fp32'"),
        ({"shared_memory_region": _p(string_param="in"), "shared_memory_byte_size": _p(uint64_param=64)}, False,
         "invalid value type for 'shared_memory_byte_size' parameter for tensor 'INPUT0', expected int64_param."),
        ({"shared_memory_region": _p(int64_param=3), "shared_memory_byte_size": _p(int64_param=64)}, False,
         "invalid value type for 'shared_memory_region' parameter for tensor 'INPUT0', expected string_param."),
        ({"shared_memory_region": _p(string_param="in")}, False,
         "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor 'INPUT0'"),
        ({"shared_memory_byte_size": _p(int64_param=64)}, False,
         "'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter for tensor 'INPUT0'"),
        ({"shared_memory_region": _p(string_param="in"), "shared_memory_byte_size": _p(int64_param=64),
          "shared_memory_offset": _p(int64_param=-1)}, False,
         "Invalid offset for shared memory region: 'in'"),
    ],
)  # fmt: skip
def test_grpc_parameter_errors(
    server: ServerThread,
    segment: MakeSegment,
    parameters: dict[str, pb.InferParameter],
    contents: bool,
    message: str,
) -> None:
    key, _ = segment(4096)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.register_system_shared_memory("in", key, 4096)
        try:
            request = _grpc_request(**parameters)
            if contents:
                request.inputs[0].contents.fp32_contents.extend([1.0] * 16)
            with pytest.raises(grpc.RpcError) as info:
                client._client_stub.ModelInfer(request, timeout=30)
            assert (info.value.code(), info.value.details()) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                message,
            )
        finally:
            client.unregister_system_shared_memory()


def test_grpc_raw_entries_skip_shared_memory_inputs(
    server: ServerThread, segment: MakeSegment
) -> None:
    """raw_input_contents belong to the inputs without shared memory, in order."""
    key, handle = segment(64)
    shm.set_shared_memory_region(handle, [np.full(4, 3.0, dtype=np.float32)])
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.register_system_shared_memory("in", key, 64)
        try:
            first = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            first.set_shared_memory("in", 16)
            second = grpcclient.InferInput("INPUT1", [1, 4], "FP32")
            second.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
            result = client.infer("add_sub", [first, second])
            assert result.as_numpy("OUTPUT0").tolist() == [[4.0] * 4]
            assert result.as_numpy("OUTPUT1").tolist() == [[2.0] * 4]
        finally:
            client.unregister_system_shared_memory()


# -- CUDA shared memory on a server without CUDA ----------------------------------------------


def test_cuda_shared_memory_answers_like_triton_without_a_gpu(
    server: ServerThread, segment: MakeSegment
) -> None:
    url = server.http_url
    handle = base64.b64encode(bytes(64)).decode()
    status, _, body = raw_request(url, "GET", "/v2/cudasharedmemory/status")
    assert (status, json.loads(body)) == (200, [])
    cases = [
        ({"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 8}, 400,
         "failed to register shared memory region: invalid args"),
        ({"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8}, 400,
         "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"),
        ({}, 400, "Shared memory register request has no 'raw_handle' field"),
        ({"raw_handle": "x"}, 500, "attempt to access non-existing object member 'b64'"),
        ({"raw_handle": {"b64": handle}}, 500, "attempt to access non-existing object member 'byte_size'"),
        ({"raw_handle": {"b64": handle}, "byte_size": 8}, 500, "attempt to access non-existing object member 'device_id'"),
    ]  # fmt: skip
    for payload, code, message in cases:
        got, _, reply = raw_request(
            url, "POST", "/v2/cudasharedmemory/region/c/register", json.dumps(payload).encode()
        )
        assert (got, error_message(reply)) == (code, message)
    got, _, reply = raw_request(url, "POST", "/v2/cudasharedmemory/register", b"{}")
    assert (got, error_message(reply)) == (
        400,
        "'region name' is necessary to register cuda shared memory region",
    )
    got, _, reply = raw_request(url, "GET", "/v2/cudasharedmemory/region/c/status")
    assert (got, error_message(reply)) == (404, "Unable to find cuda shared memory region: 'c'")
    assert raw_request(url, "POST", "/v2/cudasharedmemory/unregister", b"")[0] == 200
    assert raw_request(url, "POST", "/v2/cudasharedmemory/region/c/unregister", b"")[0] == 200

    key, _ = segment(64)
    http = httpclient.InferenceServerClient(url)
    try:
        http.register_system_shared_memory("sys", key, 64)
        assert _error(lambda: http.get_cuda_shared_memory_status("sys")) == (
            "404",
            "The region named 'sys' is registered as system shared memory, not CUDA shared memory",
        )
        with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
            assert not grpc_client.get_cuda_shared_memory_status().regions
            assert _error(
                lambda: grpc_client.register_cuda_shared_memory("c", bytes(64), 0, 8)
            ) == ("INVALID_ARGUMENT", "failed to register shared memory region: invalid args")
            assert _error(lambda: grpc_client.get_cuda_shared_memory_status("c")) == (
                "NOT_FOUND",
                "Unable to find cuda shared memory region: 'c'",
            )
            grpc_client.unregister_cuda_shared_memory()
    finally:
        http.unregister_system_shared_memory()
        http.close()


# -- the registry itself ----------------------------------------------------------------------


def test_an_unregistered_region_stays_mapped_for_a_request_that_holds_it(
    segment: MakeSegment,
) -> None:
    key, handle = segment(4096)
    shm.set_shared_memory_region(handle, [DATA])
    registry = SharedMemoryRegistry()
    registry.register("r", key, 0, 4096)
    held = registry.slice("r", 0, 64)
    registry.unregister("r")
    with pytest.raises(ServerError, match="Unable to find shared memory region: 'r'"):
        registry.slice("r", 0, 64)
    assert np.frombuffer(held.view(), dtype=np.float32).tolist() == DATA.reshape(-1).tolist()
    held.write(bytes(64))
    assert not shm.get_contents_as_numpy(handle, np.float32, [16]).any()


@pytest.mark.parametrize("key", ["", "/", "/a/b", "..", "/.."])
def test_keys_shm_open_refuses(key: str) -> None:
    with pytest.raises(ServerError) as info:
        SharedMemoryRegistry().register("r", key, 0, 64)
    assert info.value.message == f"Unable to open shared memory region: '{key}'"
