"""``GRPCInferenceService`` details with the generated stub (triton_spec §6, checklist §11 F).

``tritonclient.grpc`` always sends ``raw_input_contents``; typed ``contents``, parameter types
and the optional RPCs are exercised here with the raw stub it is built on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from reference_server.app import ServerThread

MAX = 2**31 - 1


@pytest.fixture
def stub(server: ServerThread) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(
        server.grpc_url,
        options=[
            ("grpc.max_send_message_length", MAX),
            ("grpc.max_receive_message_length", MAX),
        ],
    )
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def rpc_error(call: object, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)  # type: ignore[operator]
    return info.value


def nobatch_request(**kwargs: object) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="nobatch", **kwargs)
    tensor = request.inputs.add(name="INPUT0", datatype="INT32", shape=[2, 2])
    return request, tensor


def test_typed_contents_are_accepted(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request, tensor = nobatch_request(id="typed")
    tensor.contents.int_contents.extend([1, -2, 3, 4])
    response = stub.ModelInfer(request, timeout=30)
    assert response.id == "typed"
    assert response.model_version == "1"
    assert [o.name for o in response.outputs] == ["OUTPUT0"]
    assert len(response.raw_output_contents) == 1
    values = np.frombuffer(response.raw_output_contents[0], dtype="<i4")
    assert values.tolist() == [1, -2, 3, 4]
    assert not response.outputs[0].HasField("contents")


def test_int8_typed_contents_are_narrowed(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    request = pb.ModelInferRequest(model_name="int8_model")
    tensor = request.inputs.add(name="INPUT0", datatype="INT8", shape=[3])
    tensor.contents.int_contents.extend([1, -1, 127])
    response = stub.ModelInfer(request, timeout=30)
    assert np.frombuffer(response.raw_output_contents[0], np.int8).tolist() == [1, -1, 127]


def test_typed_int8_out_of_range_wraps() -> None:
    from reference_server.frontends.grpc import to_infer_request

    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="A", datatype="INT8", shape=[3])
    tensor.contents.int_contents.extend([1, -1, 300])
    converted = to_infer_request(request)
    assert converted.inputs["A"].dtype == np.int8
    assert converted.inputs["A"].tolist() == [1, -1, 44]  # 300 wraps like a C cast


def test_contents_mixed_with_raw_is_invalid(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    request, tensor = nobatch_request()
    tensor.contents.int_contents.extend([1, 2, 3, 4])
    request.raw_input_contents.append(np.zeros(4, dtype=np.int32).tobytes())
    error = rpc_error(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for "
        "model 'nobatch'"
    )


def test_wrong_contents_field_and_missing_data(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    request, tensor = nobatch_request()
    tensor.contents.fp32_contents.extend([1, 2, 3, 4])
    assert rpc_error(stub.ModelInfer, request).code() == grpc.StatusCode.INVALID_ARGUMENT
    request, _ = nobatch_request()
    error = rpc_error(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "unable to find data for input tensor 'INPUT0' for model 'nobatch' in request."
    )


def test_raw_size_mismatch_is_invalid(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request, _ = nobatch_request(id="x")
    request.raw_input_contents.append(b"\x00" * 12)
    error = rpc_error(stub.ModelInfer, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "[request id: x] input byte size mismatch for input 'INPUT0' for model 'nobatch'. "
        "Expected 16, got 12"
    )


@pytest.mark.parametrize(
    ("key", "param", "ok"),
    [
        ("priority", pb.InferParameter(int64_param=1), True),
        ("priority", pb.InferParameter(uint64_param=1), True),
        ("priority", pb.InferParameter(int64_param=-1), False),
        ("timeout", pb.InferParameter(int64_param=-1), True),
        ("priority", pb.InferParameter(string_param="1"), False),
        ("timeout", pb.InferParameter(int64_param=10_000_000), True),
        ("timeout", pb.InferParameter(uint64_param=10_000_000), False),
        ("triton_x", pb.InferParameter(bool_param=True), False),
        ("custom", pb.InferParameter(double_param=0.5), True),
    ],
)
def test_parameter_types(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, key: str, param: object, ok: bool
) -> None:
    request, _ = nobatch_request()
    request.raw_input_contents.append(np.zeros(4, dtype=np.int32).tobytes())
    request.parameters[key].CopyFrom(param)
    if ok:
        assert stub.ModelInfer(request, timeout=30).model_name == "nobatch"
    else:
        assert rpc_error(stub.ModelInfer, request).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_status_mapping_for_lookups(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    error = rpc_error(stub.ModelReady, pb.ModelReadyRequest(name="nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "Request for unknown model: 'nope' is not found"
    assert stub.ModelReady(pb.ModelReadyRequest(name="nobatch"), timeout=30).ready
    error = rpc_error(stub.ModelStatistics, pb.ModelStatisticsRequest(name="nope"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = rpc_error(stub.ModelConfig, pb.ModelConfigRequest(name="nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_config_and_metadata_messages(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    config = stub.ModelConfig(pb.ModelConfigRequest(name="identity_fp32"), timeout=30).config
    assert config.max_batch_size == 8
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="identity_fp32"), timeout=30)
    assert list(meta.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "FP32", [-1, 16])
    ]
    stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name="nobatch"), timeout=30)
    assert stats.model_stats[0].name == "nobatch"
    assert stats.model_stats[0].version == "1"


def test_unimplemented_optional_rpcs(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    # (Shared-memory registration is implemented: tests/server/test_shared_memory.py.)
    calls = [
        (stub.TraceSetting, pb.TraceSettingRequest()),
        (stub.LogSettings, pb.LogSettingsRequest()),
    ]
    for call, request in calls:
        assert rpc_error(call, request).code() == grpc.StatusCode.UNIMPLEMENTED
    # No region is ever registered: status lists none and unregistering is a no-op.
    status = stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest(), timeout=30)
    assert not status.regions
    assert not stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest(), timeout=30).regions
    stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=30)


def test_repository_load_parameter_types(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = pb.RepositoryModelLoadRequest(model_name="loadable")
    request.parameters["config"].bytes_param = b"{}"
    assert rpc_error(stub.RepositoryModelLoad, request).code() == grpc.StatusCode.INVALID_ARGUMENT
    request = pb.RepositoryModelLoadRequest(model_name="loadable")
    request.parameters["file:1/x"].string_param = "text"
    assert rpc_error(stub.RepositoryModelLoad, request).code() == grpc.StatusCode.INVALID_ARGUMENT
    request = pb.RepositoryModelLoadRequest(model_name="loadable")
    request.parameters["colour"].string_param = "red"
    error = rpc_error(stub.RepositoryModelLoad, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "unrecognized load parameter 'colour'."
    request = pb.RepositoryModelLoadRequest(repository_name="r", model_name="loadable")
    assert rpc_error(stub.RepositoryModelLoad, request).code() == grpc.StatusCode.UNIMPLEMENTED
    request = pb.RepositoryModelLoadRequest(model_name="ghost")
    assert rpc_error(stub.RepositoryModelLoad, request).code() == grpc.StatusCode.INTERNAL


def test_repository_index_ready_filter(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, never_loaded: str
) -> None:
    everything = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30).models
    ready = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True), timeout=30).models
    assert {m.name for m in ready} <= {m.name for m in everything}
    assert all(m.state == "READY" for m in ready)
    assert "identity_fp32" in {m.name for m in ready}  # loaded at startup
    assert never_loaded in {m.name for m in everything if not m.state}
    assert never_loaded not in {m.name for m in ready}


def test_health_check(server: ServerThread) -> None:
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    health_pb2_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
    with grpc.insecure_channel(server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_client_deadline_is_deadline_exceeded_and_server_keeps_serving(
    server: ServerThread, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    """A deadline shorter than the execution cancels the call; the next call succeeds."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from tests.server.conftest import SLOW_MODEL, write_model

    repository = server.options.model_repositories[0]
    write_model(repository, "slow_grpc", SLOW_MODEL % 300, add_name=True)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.load_model("slow_grpc")
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("slow_grpc", [tensor], client_timeout=0.05)
        assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        result = client.infer("slow_grpc", [tensor], client_timeout=30)
        assert result.as_numpy("OUTPUT0").shape == (1, 4)
    finally:
        client.unload_model("slow_grpc")
        client.close()


def test_deadline_while_queued_cancels_the_request(repository: Path, start_server: Any) -> None:
    """gRPC deadline = client gone: a queued request is dropped and counted CANCELED."""
    import tritonclient.grpc as grpcclient

    from tests.server.conftest import SLOW_MODEL, wait_until, write_model

    write_model(repository, "slow_grpc_cancel", SLOW_MODEL % 1500, add_name=True)
    server = start_server(repository, ("slow_grpc_cancel",))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    outcomes: list[Any] = []
    # Both calls give up after 0.5 s. One of them executes (1.5 s) and still completes on the
    # server; the other waits in the queue when its deadline passes and is dropped.
    for _ in range(2):
        client.async_infer(
            "slow_grpc_cancel",
            [tensor],
            callback=lambda result, error: outcomes.append(error),
            client_timeout=0.5,
        )

    def counts() -> tuple[int, int]:
        stats = client.get_inference_statistics("slow_grpc_cancel").model_stats[0]
        return stats.inference_stats.success.count, stats.inference_stats.fail.count

    wait_until(lambda: counts() == (1, 1), 20, "one request executing and one queued")
    wait_until(lambda: len(outcomes) == 2, 20, "both calls to end")
    assert all(error is not None and "DEADLINE_EXCEEDED" in error.status() for error in outcomes)
    client.close()
