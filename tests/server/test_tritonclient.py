"""The real ``tritonclient`` (HTTP and gRPC) against the reference server (checklist §11 G, H, I).

Everything here goes through the client library users have, over real sockets, so a protocol
detail the client depends on (header names, output order, status strings) is covered.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.app import ServerThread
from tests.server.conftest import DATATYPES, EXTRA_MODELS, wait_until, write_model

Client = Any  # httpclient.InferenceServerClient | grpcclient.InferenceServerClient


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def client(server: ServerThread, protocol: str) -> Iterator[Client]:
    if protocol == "http":
        http = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        yield http
        http.close()
    else:
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        yield grpc
        grpc.close()


def module_for(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def sample(datatype: str, n: int = 5) -> np.ndarray:
    """A tensor of ``n`` distinct values as tritonclient expects it for ``datatype``."""
    if datatype == "BOOL":
        return np.array([True, False, True, True, False][:n])
    if datatype == "BYTES":
        return np.array([b"", b"a", "ü".encode(), b"\x00\xff", b"longer text"][:n], dtype=object)
    if datatype == "BF16":
        import ml_dtypes  # tritonclient >= 2.73 wants BF16 arrays as ml_dtypes.bfloat16

        return np.array([1.0, -2.0, 0.5, 3.0, 0.0][:n], dtype=ml_dtypes.bfloat16)
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(datatype)
    if dtype is None:
        dtype = np.dtype(datatype.lower())
    return (np.arange(n) * 3 + 1).astype(dtype)


# -- I1-I3: round trips of every datatype -----------------------------------------------------


@pytest.mark.parametrize("mode", ["http-binary", "http-json", "grpc"])
def test_every_datatype_round_trips(server: ServerThread, mode: str) -> None:
    protocol = mode.split("-")[0]
    binary = mode != "http-json"
    mod = module_for(protocol)
    url = server.http_url if protocol == "http" else server.grpc_url
    client = mod.InferenceServerClient(url)
    inputs, outputs, expected = [], [], {}
    for datatype in DATATYPES:
        json_ok = datatype not in ("FP16", "BF16")
        as_binary = binary or not json_ok
        array = sample(datatype)
        if datatype == "BYTES" and not as_binary:  # JSON strings must be UTF-8 text
            array = np.array([b"", b"a", "\u00fc".encode(), b"x y", b"z"], dtype=object)
        tensor = mod.InferInput(f"IN_{datatype}", list(array.shape), datatype)
        if protocol == "http":
            tensor.set_data_from_numpy(array, binary_data=as_binary)
            outputs.append(mod.InferRequestedOutput(f"OUT_{datatype}", binary_data=as_binary))
        else:
            tensor.set_data_from_numpy(array)
            outputs.append(mod.InferRequestedOutput(f"OUT_{datatype}"))
        inputs.append(tensor)
        expected[f"OUT_{datatype}"] = array
    result = client.infer("all_types", inputs, outputs=outputs, request_id="rt")
    for name, array in expected.items():
        got = result.as_numpy(name)
        assert got is not None, name
        if array.dtype == object:
            # JSON BYTES come back as str, binary ones as bytes.
            as_bytes = [x.encode() if isinstance(x, str) else bytes(x) for x in got.tolist()]
            assert as_bytes == array.tolist(), name
        else:
            np.testing.assert_array_equal(got, array, err_msg=name)
    response = result.get_response()
    version = response["model_version"] if protocol == "http" else response.model_version
    assert version == "1"
    client.close()


def test_default_infer_uses_binary_both_ways(client: Client, protocol: str) -> None:
    mod = module_for(protocol)
    array = np.random.default_rng(0).random((3, 16), dtype=np.float32)
    tensor = mod.InferInput("INPUT0", [3, 16], "FP32")
    tensor.set_data_from_numpy(array)
    result = client.infer("identity_fp32", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)


def test_large_tensor_round_trip(client: Client, protocol: str) -> None:
    """10 MiB in each direction: above gRPC's default 4 MiB message limit."""
    mod = module_for(protocol)
    array = np.random.default_rng(1).random((1, 10 * 2**18), dtype=np.float32)
    tensor = mod.InferInput("INPUT0", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    result = client.infer("variable", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)


def test_compression_options_of_the_http_client(server: ServerThread) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    array = np.arange(16, dtype=np.float32).reshape(1, 16)
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(array)
    for algorithm in ("gzip", "deflate"):
        result = client.infer(
            "identity_fp32",
            [tensor],
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)
    client.close()


def test_grpc_stream_infer(server: ServerThread) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: list[Any] = []
    client.start_stream(callback=lambda result, error: results.append((result, error)))
    try:
        for index in range(5):
            tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
            tensor.set_data_from_numpy(np.full((1, 16), index, dtype=np.float32))
            client.async_stream_infer("identity_fp32", [tensor], request_id=str(index))
        bad = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
        client.async_stream_infer("identity_fp32", [bad], request_id="bad")
        wait_until(lambda: len(results) == 6, 20, "all six callbacks")
    finally:
        client.stop_stream()
        client.close()
    good = {r.get_response().id: r.as_numpy("OUTPUT0") for r, e in results if e is None}
    assert sorted(good) == ["0", "1", "2", "3", "4"]
    for key, value in good.items():
        assert value[0, 0] == float(key)
    errors = [e for _, e in results if e is not None]
    assert len(errors) == 1
    assert "unexpected shape for input 'INPUT0'" in errors[0].message()


# -- I4: statistics, repository, config --------------------------------------------------------


def test_statistics_count_a_request(client: Client, protocol: str) -> None:
    mod = module_for(protocol)

    def counts() -> tuple[int, int]:
        stats = client.get_inference_statistics("identity_fp32")
        if protocol == "http":
            entry = stats["model_stats"][0]
            return int(entry["inference_count"]), int(entry["inference_stats"]["success"]["count"])
        entry = stats.model_stats[0]
        return entry.inference_count, entry.inference_stats.success.count

    before = counts()
    tensor = mod.InferInput("INPUT0", [2, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((2, 16), dtype=np.float32))
    client.infer("identity_fp32", [tensor])
    after = counts()
    assert after[0] - before[0] == 2  # inference_count counts batch items
    assert after[1] - before[1] == 1


def test_all_model_statistics_and_fresh_model_shape(server: ServerThread) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    everything = client.get_inference_statistics()
    names = {entry["name"] for entry in everything["model_stats"]}
    assert {"identity_fp32", "all_types", "nobatch"} <= names
    fresh = client.get_inference_statistics("nobatch")["model_stats"][0]
    assert set(fresh["inference_stats"]) == {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    }
    with pytest.raises(InferenceServerException) as info:
        client.get_inference_statistics("nope")
    assert info.value.status() == "400"
    assert "requested model 'nope' is not available" in info.value.message()
    client.close()


def test_load_with_config_override_then_revert_and_unload(
    server: ServerThread, client: Client, protocol: str
) -> None:
    # A model of its own: loading and unloading a shared one would change what other tests
    # read from the session server's repository index.
    name = f"override_{protocol}"
    write_model(server.options.model_repositories[0], name, EXTRA_MODELS["loadable"], add_name=True)
    client.load_model(name)
    assert client.is_model_ready(name)
    original = client.get_model_config(name)
    original = original if protocol == "http" else json_config(original.config)
    assert original["max_batch_size"] == 4
    override = dict(original, max_batch_size=2)
    client.load_model(name, config=json.dumps(override))
    changed = client.get_model_config(name)
    changed = changed if protocol == "http" else json_config(changed.config)
    assert changed["max_batch_size"] == 2
    client.load_model(name)  # a plain load keeps the override, as in Triton 2.51
    kept = client.get_model_config(name)
    kept = kept if protocol == "http" else json_config(kept.config)
    assert kept["max_batch_size"] == 2
    client.load_model(name, config=json.dumps(original))  # reverting means sending it
    reverted = client.get_model_config(name)
    reverted = reverted if protocol == "http" else json_config(reverted.config)
    assert reverted["max_batch_size"] == 4
    index = client.get_model_repository_index()
    entries = index if protocol == "http" else [_index_dict(m) for m in index.models]
    assert {"name": name, "version": "1", "state": "READY"} in entries
    client.unload_model(name)
    unloaded = {"name": name, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}

    def index_entries() -> list[dict[str, str]]:
        index = client.get_model_repository_index()
        return list(index) if protocol == "http" else [_index_dict(m) for m in index.models]

    # Unload returns at once (state UNLOADING); UNAVAILABLE follows once it drained.
    wait_until(lambda: unloaded in index_entries(), 20, "the unloaded state in the index")
    assert not _ready(client, name)


def test_load_with_file_override(client: Client, protocol: str) -> None:
    name = f"from_files_{protocol}"
    config = {
        "name": name,
        "backend": "identity",
        "max_batch_size": 2,
        "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [3]}],
        "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [3]}],
    }
    client.load_model(name, config=json.dumps(config), files={"file:1/README": b"no weights"})
    try:
        mod = module_for(protocol)
        tensor = mod.InferInput("X", [1, 3], "INT32")
        tensor.set_data_from_numpy(np.array([[4, 5, 6]], dtype=np.int32))
        result = client.infer(name, [tensor])
        assert result.as_numpy("Y").tolist() == [[4, 5, 6]]
    finally:
        client.unload_model(name)


def json_config(config: Any) -> dict[str, Any]:
    from google.protobuf import json_format

    return json_format.MessageToDict(config, preserving_proto_field_name=True)


def _index_dict(model: Any) -> dict[str, str]:
    entry = {"name": model.name}
    for key in ("version", "state", "reason"):
        if getattr(model, key):
            entry[key] = getattr(model, key)
    return entry


def _ready(client: Client, name: str) -> bool:
    try:
        return bool(client.is_model_ready(name))
    except InferenceServerException:
        return False


# -- I5/I6: readiness and errors as the client surfaces them -----------------------------------


def test_model_ready_unknown_http_false_grpc_raises(server: ServerThread) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    assert http.is_model_ready("nope") is False
    assert http.is_server_live() and http.is_server_ready()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        grpc.is_model_ready("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert grpc.is_server_live() and grpc.is_server_ready()
    http.close()
    grpc.close()


def test_server_errors_surface_with_message_and_status(client: Client, protocol: str) -> None:
    mod = module_for(protocol)
    tensor = mod.InferInput("INPUT0", [9, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((9, 16), dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("identity_fp32", [tensor], request_id="big")
    expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert info.value.status() == expected
    assert info.value.message() == (
        "[request id: big] inference request batch-size must be <= 8 for 'identity_fp32'"
    )
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [tensor])
    assert info.value.status() == ("404" if protocol == "http" else "StatusCode.NOT_FOUND")


def test_metadata_and_config_through_the_clients(client: Client, protocol: str) -> None:
    meta = client.get_server_metadata()
    name = meta["name"] if protocol == "http" else meta.name
    assert name == "triton"
    model = client.get_model_metadata("identity_fp32")
    inputs = model["inputs"] if protocol == "http" else model.inputs
    shape = inputs[0]["shape"] if protocol == "http" else list(inputs[0].shape)
    assert shape == [-1, 16]


# -- H: metrics --------------------------------------------------------------------------------


def metric(text: str, name: str, model: str, **labels: str) -> float | None:
    wanted = {"model": model, "version": "1", **labels}
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        label_text, value = line[len(name) + 1 :].rsplit("} ", 1)
        parsed = dict(item.split("=", 1) for item in label_text.split(","))
        if {k: v.strip('"') for k, v in parsed.items()} == wanted:
            return float(value)
    return None


def test_metrics_endpoint_counts_requests(server: ServerThread) -> None:
    def scrape() -> str:
        with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
            assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
            return str(response.read().decode())

    before = scrape()
    assert "# TYPE nv_inference_request_success counter" in before
    assert "_total" not in before
    start = metric(before, "nv_inference_request_success", "nobatch") or 0.0
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [2, 2], "INT32")
    tensor.set_data_from_numpy(np.zeros((2, 2), dtype=np.int32))
    for _ in range(3):
        client.infer("nobatch", [tensor])
    client.close()
    after = scrape()
    assert metric(after, "nv_inference_request_success", "nobatch") == start + 3
    assert metric(after, "nv_inference_request_failure", "nobatch", reason="REJECTED") == 0
    with urllib.request.urlopen(server.metrics_url + "/", timeout=10) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.metrics_url.replace("/metrics", "/other"), timeout=10)
    assert info.value.code == 404


def test_asyncio_clients(server: ServerThread) -> None:
    """``tritonclient.http.aio`` (aiohttp) and ``tritonclient.grpc.aio`` work too."""
    import asyncio

    import tritonclient.grpc.aio as grpc_aio
    import tritonclient.http.aio as http_aio

    array = np.arange(32, dtype=np.float32).reshape(2, 16)

    async def scenario() -> None:
        http = http_aio.InferenceServerClient(server.http_url)
        grpc = grpc_aio.InferenceServerClient(server.grpc_url)
        try:
            assert await http.is_model_ready("identity_fp32")
            http_input = http_aio.InferInput("INPUT0", [2, 16], "FP32")
            http_input.set_data_from_numpy(array)
            grpc_input = grpc_aio.InferInput("INPUT0", [2, 16], "FP32")
            grpc_input.set_data_from_numpy(array)
            results = await asyncio.gather(
                *[http.infer("identity_fp32", [http_input]) for _ in range(4)],
                *[grpc.infer("identity_fp32", [grpc_input]) for _ in range(4)],
            )
            for result in results:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)
        finally:
            await http.close()
            await grpc.close()

    asyncio.run(scenario())
