"""KServe v2 HTTP protocol details over a real socket (triton_spec §5, checklist §11 E).

Requests are written byte by byte with ``http.client`` so that lying headers, malformed bodies
and odd encodings reach the server exactly as sent.
"""

from __future__ import annotations

import gzip
import json
import socket
import struct
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient

from reference_server.app import ServerThread
from tests.server.conftest import error_message, raw_request, wait_until

JSON = {"Content-Type": "application/json"}


def infer_json(
    server: ServerThread,
    model: str,
    body: object,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    return raw_request(
        server.http_url,
        "POST",
        f"/v2/models/{model}/infer",
        json.dumps(body).encode(),
        {**JSON, **(headers or {})},
    )


def fp32_input(values: list[float], shape: list[int] | None = None) -> dict[str, object]:
    return {
        "name": "INPUT0",
        "shape": shape or [1, len(values)],
        "datatype": "FP32",
        "data": values,
    }


def binary_request(header: dict[str, object], *blobs: bytes) -> tuple[bytes, int]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), len(head)


# -- E1/E2: health, routing -------------------------------------------------------------------


def test_health_live_and_ready_have_empty_bodies(server: ServerThread) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        status, _, body = raw_request(server.http_url, "GET", path)
        assert (status, body) == (200, b"")


def test_wrong_method_is_405(server: ServerThread) -> None:
    status, headers, body = raw_request(server.http_url, "POST", "/v2/health/live", b"")
    assert status == 405
    assert error_message(body) == "Method Not Allowed"
    assert headers["Content-Type"].startswith("application/json")
    status, _, _ = raw_request(server.http_url, "GET", "/v2/models/identity_fp32/infer")
    assert status == 405


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/v1/models/identity_fp32",
        "/v2/unknown",
        "/v2/models/identity_fp32/versions/one",
        "/v2/models/identity_fp32/versions/1/nothing",
        "/v2/models/identity_fp32/extra/ready",
        "/v2/health",
    ],
)
def test_unknown_paths_are_404_not_found(server: ServerThread, path: str) -> None:
    status, _, body = raw_request(server.http_url, "GET", path)
    assert status == 404
    assert error_message(body) == "Not Found"


# -- E3/E4: readiness and metadata ------------------------------------------------------------


def test_model_ready_and_lookup_errors(server: ServerThread) -> None:
    url = server.http_url
    assert raw_request(url, "GET", "/v2/models/identity_fp32/ready")[0] == 200
    assert raw_request(url, "GET", "/v2/models/identity_fp32/versions/1/ready")[0] == 200
    status, _, body = raw_request(url, "GET", "/v2/models/nope/ready")
    assert status == 404
    assert error_message(body) == "Request for unknown model: 'nope' is not found"
    status, _, body = raw_request(url, "GET", "/v2/models/identity_fp32/versions/7/ready")
    assert status == 404
    assert "version 7 is not found" in error_message(body)


def test_model_metadata_batch_dimension_and_versions(server: ServerThread) -> None:
    status, headers, body = raw_request(server.http_url, "GET", "/v2/models/identity_fp32")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    meta = json.loads(body)
    assert meta["versions"] == ["1"]
    assert meta["platform"] == "identity"  # falls back to the backend name
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}]
    nobatch = json.loads(raw_request(server.http_url, "GET", "/v2/models/nobatch")[2])
    assert nobatch["inputs"][0]["shape"] == [2, 2]
    versioned = json.loads(
        raw_request(server.http_url, "GET", "/v2/models/identity_fp32/versions/1")[2]
    )
    assert versioned["versions"] == ["1"]


def test_server_metadata_and_config(server: ServerThread) -> None:
    meta = json.loads(raw_request(server.http_url, "GET", "/v2")[2])
    assert meta["name"] == "triton"
    assert "binary_tensor_data" in meta["extensions"]
    status, _, body = raw_request(server.http_url, "GET", "/v2/models/identity_fp32/config")
    assert status == 200
    config = json.loads(body)
    assert config["name"] == "identity_fp32"
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100


# -- E5/E6: JSON inputs -----------------------------------------------------------------------


def test_nested_and_flat_json_data_give_the_same_answer(server: ServerThread) -> None:
    values = [float(i) for i in range(16)]
    flat = infer_json(server, "identity_fp32", {"inputs": [fp32_input(values)]})
    nested_input = fp32_input([values[:8], values[8:]], [1, 16])  # type: ignore[list-item]
    nested = infer_json(server, "identity_fp32", {"inputs": [nested_input]})
    assert flat[0] == nested[0] == 200
    assert json.loads(flat[2])["outputs"] == json.loads(nested[2])["outputs"]
    assert json.loads(flat[2])["outputs"][0]["data"] == values


@pytest.mark.parametrize(
    ("model", "entry", "status", "fragment"),
    [
        ("identity_fp32", fp32_input([1.0, 2.0], [1, 16]), 500, "Shape does not match"),
        (
            "nobatch",
            {"name": "INPUT0", "shape": [2, 2], "datatype": "INT32", "data": [1.5, 2, 3, 4]},
            500,
            "attempt to access JSON non-signed-integer as signed-integer",
        ),
        (
            "all_types",
            {"name": "IN_BOOL", "shape": [2], "datatype": "BOOL", "data": [1, 0]},
            500,
            "non-boolean",
        ),
        (
            "all_types",
            {"name": "IN_FP16", "shape": [1], "datatype": "FP16", "data": [1.0]},
            400,
            "receiving FP16 data via JSON is not supported",
        ),
        (
            "identity_fp32",
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32"},
            400,
            "Input must set only one of the following fields",
        ),
    ],
)
def test_bad_json_inputs(
    server: ServerThread, model: str, entry: dict[str, object], status: int, fragment: str
) -> None:
    got_status, _, body = infer_json(server, model, {"inputs": [entry]})
    assert got_status == status
    assert fragment in error_message(body)


def test_semantic_validation_errors_are_400_with_request_id(server: ServerThread) -> None:
    body = {"id": "r-9", "inputs": [fp32_input([1.0] * 8, [1, 8])]}
    status, _, reply = infer_json(server, "identity_fp32", body)
    assert status == 400
    assert error_message(reply).startswith(
        "[request id: r-9] unexpected shape for input 'INPUT0' for model 'identity_fp32'"
    )


# -- E7/E8: binary tensors --------------------------------------------------------------------


def test_two_binary_inputs_and_a_json_input(server: ServerThread) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.full((1, 4), 10, dtype=np.float32)
    header = {
        "inputs": [
            {
                "name": "INPUT1",
                "shape": [1, 4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 16},
            },
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [0, 1, 2, 3]},
        ],
        "outputs": [{"name": "OUTPUT1", "parameters": {"binary_data": True}}],
    }
    body, length = binary_request(header, b.tobytes())
    status, headers, reply = raw_request(
        server.http_url,
        "POST",
        "/v2/models/add_sub/infer",
        body,
        {"Inference-Header-Content-Length": str(length)},
    )
    assert status == 200, reply
    json_length = int(headers["Inference-Header-Content-Length"])
    assert headers["Content-Type"] == "application/octet-stream"
    answer = json.loads(reply[:json_length])
    assert [o["name"] for o in answer["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(np.frombuffer(reply[json_length:], np.float32), (a - b)[0])


@pytest.mark.parametrize(
    ("declared", "blob", "fragment"),
    [
        (64, b"\x00" * 16, "unexpected size for input 'INPUT0', expecting 48 additional bytes"),
        (64, b"\x00" * 68, "unexpected additional input data for model 'identity_fp32'"),
    ],
)
def test_binary_size_lies(server: ServerThread, declared: int, blob: bytes, fragment: str) -> None:
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "FP32",
                "parameters": {"binary_data_size": declared},
            }
        ]
    }
    body, length = binary_request(header, blob)
    status, _, reply = raw_request(
        server.http_url,
        "POST",
        "/v2/models/identity_fp32/infer",
        body,
        {"Inference-Header-Content-Length": str(length)},
    )
    assert status == 400
    assert fragment in error_message(reply)


def test_header_length_missing_larger_than_body_or_garbage(server: ServerThread) -> None:
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 64},
            }
        ]
    }
    body, length = binary_request(header, b"\x00" * 64)
    url = server.http_url
    path = "/v2/models/identity_fp32/infer"
    # Without the header the server reads the whole body as JSON: the binary tail breaks it.
    status, _, reply = raw_request(url, "POST", path, body)
    assert status == 500
    assert error_message(reply).startswith("failed to parse the request JSON buffer")
    status, _, reply = raw_request(
        url, "POST", path, body, {"Inference-Header-Content-Length": str(len(body) + 1)}
    )
    assert status == 400
    assert error_message(reply) == (
        f"inference header size should be in range (0, {len(body)}), got: {len(body) + 1}"
    )
    status, _, reply = raw_request(
        url, "POST", path, body, {"Inference-Header-Content-Length": "12abc"}
    )
    assert status == 400
    assert "Unable to parse Inference-Header-Content-Length" in error_message(reply)
    # The JSON-only body of the same request, without the header, is a binary-without-header
    # error (400), not a parse error.
    status, _, reply = raw_request(url, "POST", path, body[:length])
    assert status == 400
    assert "Infer-Header-Content-Length" in error_message(reply)


def test_raw_binary_body_single_input_model(server: ServerThread) -> None:
    values = np.arange(5, dtype=np.float32)
    status, headers, reply = raw_request(
        server.http_url,
        "POST",
        "/v2/models/variable/infer",
        values.tobytes(),
        {"Inference-Header-Content-Length": "0"},
    )
    assert status == 200, reply
    length = int(headers["Inference-Header-Content-Length"])
    answer = json.loads(reply[:length])
    assert answer["outputs"][0]["shape"] == [1, 5]
    assert answer["outputs"][0]["parameters"] == {"binary_data_size": 20}
    np.testing.assert_array_equal(np.frombuffer(reply[length:], np.float32), values)


def test_raw_binary_body_bytes_model(server: ServerThread) -> None:
    status, headers, reply = raw_request(
        server.http_url,
        "POST",
        "/v2/models/bytes_model/infer",
        b"hello",
        {"Inference-Header-Content-Length": "0"},
    )
    assert status == 200, reply
    length = int(headers["Inference-Header-Content-Length"])
    assert reply[length:] == struct.pack("<I", 5) + b"hello"


def test_raw_binary_body_on_multi_input_model_is_400(server: ServerThread) -> None:
    status, _, reply = raw_request(
        server.http_url,
        "POST",
        "/v2/models/add_sub/infer",
        b"\x00" * 16,
        {"Inference-Header-Content-Length": "0"},
    )
    assert status == 400
    assert "Raw request must only have 1 input" in error_message(reply)


# -- E9-E11: outputs and the response layout --------------------------------------------------


def test_output_selection_rules(server: ServerThread) -> None:
    inputs = [
        {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
    ]
    status, headers, reply = infer_json(server, "add_sub", {"inputs": inputs})
    assert status == 200
    assert "Inference-Header-Content-Length" not in headers
    answer = json.loads(reply)
    assert [o["data"] for o in answer["outputs"]] == [[2, 3, 4, 5], [0, 1, 2, 3]]
    assert "id" not in answer
    assert answer["model_version"] == "1"

    body = {
        "id": "abc",
        "parameters": {"binary_data_output": True},
        "inputs": inputs,
        "outputs": [{"name": "OUTPUT1"}],
    }
    status, headers, reply = infer_json(server, "add_sub", body)
    answer = json.loads(reply)
    assert answer["id"] == "abc"
    # An explicitly listed output without binary_data stays JSON despite binary_data_output.
    assert answer["outputs"] == [
        {"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, 3]}
    ]

    body = {"parameters": {"binary_data_output": True}, "inputs": inputs}
    status, headers, reply = infer_json(server, "add_sub", body)
    length = int(headers["Inference-Header-Content-Length"])
    answer = json.loads(reply[:length])
    assert [o["parameters"]["binary_data_size"] for o in answer["outputs"]] == [16, 16]
    assert len(reply) == length + 32


@pytest.mark.parametrize(
    ("outputs", "fragment"),
    [
        ([{"name": "NOPE"}], "unexpected inference output 'NOPE' for model 'add_sub'"),
        ([{"name": "OUTPUT0"}, {"name": "OUTPUT0"}], "output 'OUTPUT0' already exists"),
    ],
)
def test_bad_output_requests(server: ServerThread, outputs: list[object], fragment: str) -> None:
    inputs = [
        {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
    ]
    status, _, reply = infer_json(server, "add_sub", {"inputs": inputs, "outputs": outputs})
    assert status == 400
    assert fragment in error_message(reply)


def test_zero_size_binary_output(server: ServerThread) -> None:
    body = {
        "parameters": {"binary_data_output": True},
        "inputs": [{"name": "INPUT0", "shape": [1, 0], "datatype": "FP32"}],
    }
    status, headers, reply = infer_json(server, "variable", body)
    assert status == 200, reply
    assert "Inference-Header-Content-Length" not in headers
    assert json.loads(reply)["outputs"][0]["parameters"] == {"binary_data_size": 0}


def test_fp32_json_output_formatting(server: ServerThread) -> None:
    values = [0.1] + [0.0] * 15
    status, _, reply = infer_json(server, "identity_fp32", {"inputs": [fp32_input(values)]})
    assert status == 200
    assert b"0.10000000149011612" in reply


def test_bytes_json_round_trip(server: ServerThread) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "shape": [2, 1], "datatype": "BYTES", "data": ["hé", "x y"]}]
    }
    status, _, reply = infer_json(server, "bytes_model", body)
    assert status == 200, reply
    assert json.loads(reply)["outputs"][0]["data"] == ["hé", "x y"]


# -- E12: parameters --------------------------------------------------------------------------


def test_triton_prefixed_parameter_is_400(server: ServerThread) -> None:
    body = {"parameters": {"triton_foo": 1}, "inputs": [fp32_input([0.0] * 16)]}
    status, _, reply = infer_json(server, "identity_fp32", body)
    assert status == 400
    assert "reserved for Triton usage" in error_message(reply)


# -- E13: compression -------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_request_and_response(server: ServerThread, encoding: str) -> None:
    raw = json.dumps({"inputs": [fp32_input([1.0] * 16)]}).encode()
    body = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    status, headers, reply = raw_request(
        server.http_url,
        "POST",
        "/v2/models/identity_fp32/infer",
        body,
        {"Content-Encoding": encoding, "Accept-Encoding": f"identity;q=0.5, {encoding};q=0.9"},
    )
    assert status == 200, reply
    assert headers["Content-Encoding"] == encoding
    plain = gzip.decompress(reply) if encoding == "gzip" else zlib.decompress(reply)
    assert json.loads(plain)["outputs"][0]["data"] == [1.0] * 16


def test_accept_encoding_with_zero_q_is_not_compressed(server: ServerThread) -> None:
    raw = json.dumps({"inputs": [fp32_input([1.0] * 16)]}).encode()
    status, headers, reply = raw_request(
        server.http_url,
        "POST",
        "/v2/models/identity_fp32/infer",
        raw,
        {"Accept-Encoding": "gzip;q=0"},
    )
    assert status == 200
    assert "Content-Encoding" not in headers
    assert json.loads(reply)["model_name"] == "identity_fp32"


def test_unsupported_and_corrupt_encodings(server: ServerThread) -> None:
    raw = json.dumps({"inputs": [fp32_input([1.0] * 16)]}).encode()
    path = "/v2/models/identity_fp32/infer"
    status, headers, reply = raw_request(
        server.http_url, "POST", path, raw, {"Content-Encoding": "br"}
    )
    assert status == 501
    assert error_message(reply) == "Unsupported compression type"
    assert headers["Accept-Encoding"] == "gzip, deflate"
    status, _, reply = raw_request(
        server.http_url, "POST", path, b"not gzip at all", {"Content-Encoding": "gzip"}
    )
    assert status == 400
    assert error_message(reply).startswith("failed to decompress the request body")
    truncated = gzip.compress(raw)[:-12]
    status, _, reply = raw_request(
        server.http_url, "POST", path, truncated, {"Content-Encoding": "gzip"}
    )
    assert status == 400
    assert error_message(reply) == "the request body is not a complete gzip stream"
    assert raw_request(server.http_url, "GET", "/v2/health/live")[0] == 200


def test_gzip_binary_request_uses_inflated_header_length(server: ServerThread) -> None:
    values = np.arange(16, dtype=np.float32).reshape(1, 16)
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 64},
            }
        ]
    }
    body, length = binary_request(header, values.tobytes())
    status, _, reply = raw_request(
        server.http_url,
        "POST",
        "/v2/models/identity_fp32/infer",
        gzip.compress(body),
        {"Content-Encoding": "gzip", "Inference-Header-Content-Length": str(length)},
    )
    assert status == 200, reply
    assert json.loads(reply)["outputs"][0]["data"] == values.reshape(-1).tolist()


# -- E14/E16: malformed and oversized bodies --------------------------------------------------


def test_malformed_json_is_500_and_the_server_keeps_serving(server: ServerThread) -> None:
    for body in (b"{", b"[1,2", b"\xff\xfe", b"null", b'{"inputs": 3}'):
        status, _, reply = raw_request(
            server.http_url, "POST", "/v2/models/identity_fp32/infer", body, JSON
        )
        assert status == 500, body
        assert error_message(reply)
    status, _, _ = infer_json(server, "identity_fp32", {"inputs": [fp32_input([0.0] * 16)]})
    assert status == 200


def test_oversized_body_is_400_with_a_clear_message(
    repository: object, start_server: object
) -> None:
    from pathlib import Path

    assert isinstance(repository, Path)
    running = start_server(  # type: ignore[operator]
        repository, ("identity_fp32",), max_input_size_bytes=4096
    )
    big = json.dumps({"inputs": [fp32_input([1.0] * 2000, [1, 2000])]}).encode()
    assert len(big) > 4096
    status, _, reply = raw_request(
        running.http_url, "POST", "/v2/models/identity_fp32/infer", big, JSON
    )
    assert status == 400
    message = error_message(reply)
    assert "exceeds the maximum allowed value of 4096 bytes" in message
    assert "--http-max-input-size" in message
    # Chunked (no Content-Length) bodies are bounded while they are read.
    host, port = running.http_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = (
            "POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        chunk = f"{len(big):x}\r\n".encode() + big + b"\r\n0\r\n\r\n"
        sock.sendall(head.encode() + chunk)
        reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 400")
    assert b"exceeds the maximum allowed value of 4096 bytes" in reply
    # A small gzip body that inflates beyond the limit is stopped at the limit.
    bomb = gzip.compress(b" " * 1_000_000)
    assert len(bomb) < 4096
    status, _, reply = raw_request(
        running.http_url,
        "POST",
        "/v2/models/identity_fp32/infer",
        bomb,
        {"Content-Encoding": "gzip"},
    )
    assert status == 400
    assert "exceeds the maximum allowed value of 4096 bytes" in error_message(reply)
    small = {"inputs": [fp32_input([1.0] * 16)]}
    assert infer_json(running, "identity_fp32", small)[0] == 200


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


# -- repository extension over raw HTTP (§2.6) ------------------------------------------------


def test_repository_index_body_forms(server: ServerThread, never_loaded: str) -> None:
    url = server.http_url
    status, headers, body = raw_request(url, "POST", "/v2/repository/index", b"")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    index = json.loads(body)
    assert isinstance(index, list)
    names = [entry["name"] for entry in index]
    assert names == sorted(names)
    assert {"name": never_loaded} in index  # in the repository, never loaded
    ready = json.loads(raw_request(url, "POST", "/v2/repository/index", b'{"ready":true}')[2])
    assert all(entry["state"] == "READY" for entry in ready)
    assert {"name": "identity_fp32", "version": "1", "state": "READY"} in ready
    assert never_loaded not in {entry["name"] for entry in ready}
    status, _, body = raw_request(url, "POST", "/v2/repository/index", b'{"ready":"yes"}')
    assert status == 400
    assert error_message(body) == "Invalid value for 'ready': expected a boolean"
    named = raw_request(url, "POST", "/v2/repository/myrepo/index", b"")
    assert named[0] == 200
    assert raw_request(url, "GET", "/v2/repository/index")[0] == 405


def test_repository_load_errors(server: ServerThread) -> None:
    url = server.http_url
    status, _, body = raw_request(url, "POST", "/v2/repository/models/ghost/load", b"")
    assert status == 500
    assert "failed to poll from model repository" in error_message(body)
    bad = json.dumps({"parameters": {"colour": "red"}}).encode()
    status, _, body = raw_request(url, "POST", "/v2/repository/models/loadable/load", bad)
    assert status == 500
    assert error_message(body) == "unexpected error on creating Triton parameter"
    status, _, body = raw_request(url, "POST", "/v2/repository/myrepo/models/loadable/load", b"")
    assert status == 501
    assert error_message(body) == "'repository_name' specification is not supported"
    not_json = json.dumps({"parameters": {"config": "{not json"}}).encode()
    status, _, body = raw_request(url, "POST", "/v2/repository/models/loadable/load", not_json)
    # Triton 2.51: 500 "failed to poll" for any refused override; the reason is appended here.
    assert status == 500
    assert error_message(body).startswith(
        "failed to load 'loadable', failed to poll from model repository: Invalid config override"
    )
    status, _, _ = raw_request(url, "POST", "/v2/repository/models/ghost/unload", b"")
    assert status == 200


def test_unloaded_model_lookup_errors_and_versioned_infer(server: ServerThread) -> None:
    from tests.server.conftest import EXTRA_MODELS, write_model

    write_model(
        server.options.model_repositories[0], "unload_me", EXTRA_MODELS["loadable"], add_name=True
    )
    url = server.http_url
    assert raw_request(url, "POST", "/v2/repository/models/unload_me/load", b"")[0] == 200
    body = json.dumps({"inputs": [fp32_input([1.0, 2.0, 3.0, 4.0])]}).encode()
    status, _, reply = raw_request(url, "POST", "/v2/models/unload_me/versions/1/infer", body)
    assert status == 200
    assert json.loads(reply)["model_version"] == "1"
    status, _, reply = raw_request(url, "POST", "/v2/models/unload_me/versions/2/infer", body)
    assert status == 404
    assert "version 2 is not found" in error_message(reply)
    assert raw_request(url, "POST", "/v2/repository/models/unload_me/unload", b"")[0] == 200

    def gone() -> bool:
        return raw_request(url, "GET", "/v2/models/unload_me/ready")[0] == 404

    wait_until(gone, 20, "unload_me to leave the repository index")
    status, _, reply = raw_request(url, "GET", "/v2/models/unload_me/ready")
    assert (
        error_message(reply) == "Request for unknown model: 'unload_me' has no available versions"
    )
    status, _, reply = raw_request(url, "GET", "/v2/models/unload_me/versions/1/ready")
    assert status == 503
    assert error_message(reply).endswith("version 1 is not at ready state")


def test_rejected_requests_do_not_count_as_failures(server: ServerThread) -> None:
    def fail_count() -> int:
        stats = json.loads(raw_request(server.http_url, "GET", "/v2/models/nobatch/stats")[2])
        return int(stats["model_stats"][0]["inference_stats"]["fail"]["count"])

    before = fail_count()
    bad = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "INT32", "data": [1, 2, 3]}]}
    assert infer_json(server, "nobatch", bad)[0] == 400
    assert infer_json(server, "nobatch", {"inputs": "x"})[0] == 500
    assert fail_count() == before


def test_chunked_request_body_is_accepted(server: ServerThread) -> None:
    body = json.dumps({"inputs": [fp32_input([2.0] * 16)]}).encode()
    host, port = server.http_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = (
            b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        half = len(body) // 2
        chunks = b"".join(
            f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:half], body[half:])
        )
        sock.sendall(head + chunks + b"0\r\n\r\n")
        reply = _read_all(sock)
    assert reply.startswith(b"HTTP/1.1 200")
    assert b'"data":[2.0,2.0' in reply


def test_shared_memory_endpoints_report_no_regions(server: ServerThread) -> None:
    url = server.http_url
    for kind in ("systemsharedmemory", "cudasharedmemory"):
        status, _, body = raw_request(url, "GET", f"/v2/{kind}/status")
        assert (status, json.loads(body)) == (200, [])
        assert raw_request(url, "POST", f"/v2/{kind}/unregister", b"")[0] == 200
        assert raw_request(url, "POST", f"/v2/{kind}/region/r1/unregister", b"")[0] == 200
        status, _, body = raw_request(url, "POST", f"/v2/{kind}/region/r1/register", b"{}")
        assert status == 400  # Triton's answer to a register body without its handle
        field = {"systemsharedmemory": "key", "cudasharedmemory": "raw_handle"}[kind]
        assert error_message(body) == f"Shared memory register request has no '{field}' field"
    client = httpclient.InferenceServerClient(url)
    assert client.get_system_shared_memory_status() == []
    client.unregister_system_shared_memory()
    client.close()


def test_expect_100_continue(server: ServerThread) -> None:
    body = json.dumps({"inputs": [fp32_input([3.0] * 16)]}).encode()
    host, port = server.http_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = (
            "POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        sock.sendall(head)
        interim = sock.recv(4096)
        assert interim.startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        reply = interim + _read_all(sock)
    final = reply[reply.index(b"\r\n\r\n") + 4 :]
    assert final.startswith(b"HTTP/1.1 200")
