"""System shared memory against the real Triton 2.51: the same calls get the same answers.

One script of calls (:func:`_script`) runs against the wheel's Triton and against the reference
server, over HTTP and gRPC with the real ``tritonclient`` and as raw HTTP bodies and gRPC
messages: registering (good, duplicate, unknown key, outside the segment, an offset off a page),
status (all, one, unknown), inference with inputs read from and outputs written into regions
(the reply, and the bytes the region holds afterwards), every inference error, the CUDA calls
on a host without a usable GPU, and unregistering. Each call's outcome (result, or status and
message) must be equal.

Both runs use the same segment keys (made afresh for each server and unlinked in ``finally``),
since keys appear in replies. Not compared, because 2.51 has a bug there: a second region on a
key that is already registered fails in 2.51 with ``Invalid shared memory region`` (it reuses a
closed descriptor); the reference server allows it, as later Tritons do.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from google.protobuf import json_format
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from tests.support.real_triton import RealTriton, identity_model_config
from tests.support.servers import ReferenceServer

pytestmark = [pytest.mark.triton, pytest.mark.slow]

DATA = np.arange(16, dtype=np.float32).reshape(1, 16)
Outcome = tuple[str, Any]


class Server(Protocol):
    @property
    def http_url(self) -> str: ...

    @property
    def grpc_url(self) -> str: ...

    def http_status(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout_s: float = 10.0
    ) -> tuple[int, bytes]: ...


@contextmanager
def _segments(token: str) -> Iterator[dict[str, Any]]:
    """``in`` (4096 bytes: DATA, then 2 * DATA at 64), ``out`` (64) and ``x`` (8192)."""
    sizes = {"in": 4096, "out": 64, "x": 8192}
    handles: dict[str, Any] = {}
    try:
        for name, size in sizes.items():
            key = f"/perfsweep_diff_{token}_{name}"
            handles[name] = shm.create_shared_memory_region(key[1:], key, size, create_only=True)
        shm.set_shared_memory_region(handles["in"], [DATA])
        shm.set_shared_memory_region(handles["in"], [DATA * 2], offset=64)
        yield handles
    finally:
        for handle in handles.values():
            shm.destroy_shared_memory_region(handle)


def _outcome(call: Callable[[], Any]) -> Outcome:
    try:
        return ("OK", call())
    except InferenceServerException as exc:
        return (str(exc.status()), exc.message())
    except grpc.RpcError as exc:
        return (str(exc.code()), exc.details())


def _grpc_status(client: Any, name: str = "") -> dict[str, Any]:
    reply: dict[str, Any] = client.get_system_shared_memory_status(name, as_json=True)
    return reply


def _infer(
    client: Any,
    *,
    in_region: str = "in",
    in_size: int = 64,
    in_offset: int = 0,
    out_region: str | None = "out",
    out_size: int = 64,
    out_offset: int = 0,
) -> Any:
    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    tensor = module.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_shared_memory(in_region, in_size, offset=in_offset)
    outputs = None
    if out_region is not None:
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(out_region, out_size, offset=out_offset)
        outputs = [output]
    result = client.infer("identity", [tensor], outputs=outputs)
    if module is grpcclient:
        return result.get_response(as_json=True)
    return result.get_response()


def _client_steps(client: Any, keys: dict[str, str], handles: dict[str, Any]) -> list[Outcome]:
    is_grpc = isinstance(client, grpcclient.InferenceServerClient)

    def status(name: str = "") -> Any:
        return (
            _grpc_status(client, name) if is_grpc else client.get_system_shared_memory_status(name)
        )

    def register(name: str, key: str, size: int, offset: int = 0) -> Callable[[], Any]:
        return lambda: client.register_system_shared_memory(name, key, size, offset=offset)

    def out_region() -> list[float]:
        values: list[float] = shm.get_contents_as_numpy(handles["out"], np.float32, [16]).tolist()
        return values

    steps: list[Callable[[], Any]] = [
        status,
        register("in", keys["in"], 4096),
        register("out", keys["out"], 64),
        register("in", keys["in"], 4096),
        register("y", keys["in"].replace("_in", "_missing"), 64),
        register("x", keys["x"], 9000),
        register("x", keys["x"], 100, offset=8190),
        register("x", keys["x"], 64, offset=128),
        register("x", keys["x"], 64, offset=4096),
        status,
        lambda: status("x"),
        lambda: status("nope"),
        lambda: _infer(client),
        out_region,
        lambda: _infer(client, in_offset=64),
        out_region,
        lambda: _infer(client, out_region=None),
        lambda: _infer(client, in_size=32),
        lambda: _infer(client, in_size=128),
        lambda: _infer(client, out_size=32),
        lambda: _infer(client, out_region="out", out_offset=32, out_size=64),
        lambda: _infer(client, in_region="nope"),
        lambda: _infer(client, out_region="nope"),
        lambda: _infer(client, in_offset=5000),
        lambda: _infer(client, in_offset=4090),
        lambda: client.get_cuda_shared_memory_status(**({"as_json": True} if is_grpc else {})),
        lambda: client.get_cuda_shared_memory_status("in"),
        lambda: client.get_cuda_shared_memory_status("nope"),
        client.unregister_cuda_shared_memory,
        lambda: client.unregister_system_shared_memory("x"),
        lambda: client.unregister_system_shared_memory("nope"),
        status,
        client.unregister_system_shared_memory,
        status,
    ]
    outcomes = []
    for step in steps:
        code, value = _outcome(step)
        if isinstance(value, Message):  # compared as data: a protobuf map has no order
            value = json_format.MessageToDict(value)
        outcomes.append((code, value))
    return outcomes


def _http_bodies(server: Server, keys: dict[str, str]) -> list[Outcome]:
    handle = base64.b64encode(bytes(64)).decode()
    shm_input = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}

    def params(**values: Any) -> dict[str, Any]:
        return {**shm_input, "parameters": values}

    good = {"shared_memory_region": "in", "shared_memory_byte_size": 64}
    calls: list[tuple[str, str, Any]] = [
        ("POST", "/v2/systemsharedmemory/region/q/register", {"key": keys["in"]}),
        ("POST", "/v2/systemsharedmemory/region/q/register", {"byte_size": 8}),
        ("POST", "/v2/systemsharedmemory/region/q/register", {"key": 5, "byte_size": 8}),
        ("POST", "/v2/systemsharedmemory/region/q/register", {"key": keys["in"], "byte_size": -1}),
        ("POST", "/v2/systemsharedmemory/register", {"key": keys["in"], "byte_size": 8}),
        ("GET", "/v2/systemsharedmemory/region/q/register", None),
        ("POST", "/v2/systemsharedmemory/status", None),
        ("POST", "/v2/systemsharedmemory/region/in/register", {"key": keys["in"], "byte_size": 4096}),
        ("GET", "/v2/systemsharedmemory/region/in/status", None),
        ("GET", "/v2/systemsharedmemory/status", None),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(**good)]}),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(**good)], "parameters": {"binary_data_output": True}}),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(shared_memory_region="in")]}),
        ("POST", "/v2/models/identity/infer", {"inputs": [{**params(**good), "data": [1.0] * 16}]}),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(**good, binary_data_size=64)]}),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(shared_memory_byte_size=64)]}),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(shared_memory_region=5, shared_memory_byte_size=64)]}),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(shared_memory_region="in", shared_memory_byte_size="64")]}),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(**good, shared_memory_offset=-1)]}),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(**good)], "outputs": [{"name": "OUTPUT0", "parameters": {**good, "shared_memory_offset": 1024}}]}),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(**good)], "outputs": [{"name": "OUTPUT0", "parameters": {**good, "binary_data": True}}]}),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(**good)], "outputs": [{"name": "OUTPUT0", "parameters": {**good, "classification": 2}}]}),
        ("POST", "/v2/models/identity/infer", {"inputs": [params(**good)], "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_byte_size": 64}}]}),
        ("GET", "/v2/cudasharedmemory/status", None),
        ("POST", "/v2/cudasharedmemory/region/c/register", {"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 8}),
        ("POST", "/v2/cudasharedmemory/region/c/register", {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 8}),
        ("POST", "/v2/cudasharedmemory/region/c/register", {}),
        ("POST", "/v2/cudasharedmemory/region/c/register", {"raw_handle": {"b64": handle}}),
        ("POST", "/v2/cudasharedmemory/register", {"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 8}),
        ("GET", "/v2/cudasharedmemory/region/c/status", None),
        ("POST", "/v2/cudasharedmemory/region/c/unregister", None),
        ("POST", "/v2/systemsharedmemory/region/in/unregister", None),
        ("GET", "/v2/systemsharedmemory/region/in/status", None),
    ]  # fmt: skip
    outcomes: list[Outcome] = []
    for method, path, body in calls:
        status, payload = server.http_status(method, path, body)
        outcomes.append((str(status), payload.decode("latin-1")))
    return outcomes


def _grpc_messages(server: Server, keys: dict[str, str]) -> list[Outcome]:
    def request(**parameters: pb.InferParameter) -> pb.ModelInferRequest:
        message = pb.ModelInferRequest(model_name="identity")
        tensor = message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
        for key, value in parameters.items():
            tensor.parameters[key].CopyFrom(value)
        return message

    region = pb.InferParameter(string_param="in")
    size = pb.InferParameter(int64_param=64)
    with_contents = request(shared_memory_region=region, shared_memory_byte_size=size)
    with_contents.inputs[0].contents.fp32_contents.extend([1.0] * 16)
    with_raw = request(shared_memory_region=region, shared_memory_byte_size=size)
    with_raw.raw_input_contents.append(DATA.tobytes())
    to_region = request(shared_memory_region=region, shared_memory_byte_size=size)
    output = to_region.outputs.add(name="OUTPUT0")
    output.parameters["shared_memory_region"].string_param = "in"
    output.parameters["shared_memory_byte_size"].int64_param = 64
    output.parameters["shared_memory_offset"].int64_param = 1024
    classified = request(shared_memory_region=region, shared_memory_byte_size=size)
    output = classified.outputs.add(name="OUTPUT0")
    output.parameters["shared_memory_region"].string_param = "in"
    output.parameters["shared_memory_byte_size"].int64_param = 64
    output.parameters["classification"].int64_param = 2
    infer = [
        with_contents,
        with_raw,
        to_region,
        classified,
        request(shared_memory_region=region, shared_memory_byte_size=pb.InferParameter(uint64_param=64)),
        request(shared_memory_region=pb.InferParameter(int64_param=1), shared_memory_byte_size=size),
        request(shared_memory_region=region),
        request(shared_memory_byte_size=size),
        request(shared_memory_offset=size),
        request(shared_memory_region=region, shared_memory_byte_size=size, shared_memory_offset=pb.InferParameter(int64_param=-1)),
        request(shared_memory_region=region, shared_memory_byte_size=pb.InferParameter(int64_param=-1)),
    ]  # fmt: skip
    outcomes: list[Outcome] = []
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        stub = client._client_stub
        client.register_system_shared_memory("in", keys["in"], 4096)
        try:
            for message in infer:
                outcomes.append(_outcome(lambda m=message: str(stub.ModelInfer(m, timeout=30))))
            for cuda in (
                pb.CudaSharedMemoryRegisterRequest(name="c", raw_handle=bytes(64), byte_size=8),
                pb.CudaSharedMemoryRegisterRequest(name="c", raw_handle=bytes(10), byte_size=8),
                pb.CudaSharedMemoryRegisterRequest(),
                pb.CudaSharedMemoryRegisterRequest(name="in", raw_handle=bytes(64), byte_size=8),
            ):
                outcomes.append(
                    _outcome(lambda r=cuda: str(stub.CudaSharedMemoryRegister(r, timeout=30)))
                )
            for system in (
                pb.SystemSharedMemoryRegisterRequest(),
                pb.SystemSharedMemoryRegisterRequest(name="a", key="/nokey", byte_size=4),
                pb.SystemSharedMemoryRegisterRequest(name="z", key=keys["out"], byte_size=0),
            ):
                outcomes.append(
                    _outcome(lambda r=system: str(stub.SystemSharedMemoryRegister(r, timeout=30)))
                )
        finally:
            client.unregister_system_shared_memory()
    return outcomes


def _script(server: Server, token: str) -> dict[str, list[Outcome]]:
    with _segments(token) as handles:
        keys = {name: f"/perfsweep_diff_{token}_{name}" for name in handles}
        results: dict[str, list[Outcome]] = {}
        http = httpclient.InferenceServerClient(server.http_url)
        try:
            results["http"] = _client_steps(http, keys, handles)
        finally:
            http.unregister_system_shared_memory()
            http.close()
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            try:
                results["grpc"] = _client_steps(client, keys, handles)
            finally:
                client.unregister_system_shared_memory()
        results["http-bodies"] = _http_bodies(server, keys)
        results["grpc-messages"] = _grpc_messages(server, keys)
        results["region-after"] = [
            ("OK", shm.get_contents_as_numpy(handles["in"], np.float32, [16], offset=1024).tolist())
        ]
        return results


def test_shared_memory_matches_triton(real_triton: RealTriton, tmp_path: Path) -> None:
    token = uuid.uuid4().hex[:8]
    expected = _script(real_triton, token)
    with ReferenceServer(tmp_path, models=[identity_model_config()]) as reference:
        got = _script(reference, token)
    # The scripts did what they claim: regions served inference on Triton.
    assert expected["http"][13] == ("OK", DATA.reshape(-1).tolist())
    assert expected["region-after"] == [("OK", DATA.reshape(-1).tolist())]
    for part in expected:
        assert len(got[part]) == len(expected[part])
        for index, (mine, theirs) in enumerate(zip(got[part], expected[part], strict=True)):
            assert mine == theirs, f"{part} step {index}: {json.dumps(mine)[:300]}"
