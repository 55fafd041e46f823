"""Mutual TLS and restricted APIs against the real Triton 2.51: same flags, same answers.

Both servers start with the same command-line flags (:data:`FLAGS`): mutual TLS on the gRPC
port, and each protocol restricting some API groups behind one of two keys. The same requests,
with and without the right header, must get the same status and the same error message; over
gRPC they go through a mutual-TLS ``tritonclient`` with the right certificates, and clients
without them must fail to connect to either. HTTP ``health`` stays open: the Triton harness
waits for ``/v2/health/ready`` without headers.

Not compared: what a restricted trace or logging call answers *with* its header (Triton serves
those settings; this server answers 404 over HTTP and UNIMPLEMENTED over gRPC, restricted or not).
"""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.certs import Certificates, write_certificates
from tests.support.real_triton import RealTriton, TritonInstall, identity_model_config
from tests.support.servers import ReferenceProcess

pytestmark = pytest.mark.triton

Server = RealTriton | ReferenceProcess
ADMIN = {"admin-key": "secret"}
INFER = {"infer-key": "abc"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "secret"}
GRPC_INFER = {"triton-grpc-protocol-infer-key": "abc"}
HTTP_GROUPS = (
    "--http-restricted-api=metadata,model-config,statistics,trace:admin-key=secret",
    "--http-restricted-api=inference,model-repository,shared-memory:infer-key=abc",
)
GRPC_GROUPS = (
    "--grpc-restricted-protocol=health,metadata,statistics:admin-key=secret",
    "--grpc-restricted-protocol=inference,model-config,model-repository,shared-memory:"
    "infer-key=abc",
)
INFER_BODY = {
    "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}]
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return write_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def servers(
    triton_install: TritonInstall, certs: Certificates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Server]]:
    flags = (*certs.server_flags(mutual=True), *HTTP_GROUPS, *GRPC_GROUPS)
    models = [identity_model_config()]
    with (
        RealTriton(
            triton_install, tmp_path_factory.mktemp("triton"), models=models, extra_args=flags
        ) as triton,
        ReferenceProcess(tmp_path_factory.mktemp("reference"), models, args=flags) as reference,
    ):
        yield triton, reference


# ------------------------------------------------------------------------------ HTTP

HTTP_CASES: list[tuple[str, str, Mapping[str, str]]] = [
    ("GET", "/v2", {}),
    ("GET", "/v2", ADMIN),
    ("GET", "/v2/models/identity", {}),
    ("GET", "/v2/models/identity/config", {}),
    ("GET", "/v2/models/identity/config", INFER),
    ("GET", "/v2/models/identity/config", {"admin-key": "Secret"}),
    ("GET", "/v2/models/identity/config", {"ADMIN-KEY": "secret"}),
    ("GET", "/v2/models/nosuch/config", {}),
    ("GET", "/v2/models/stats", {}),
    ("GET", "/v2/models/stats", ADMIN),
    ("GET", "/v2/models/identity/stats", {}),
    ("POST", "/v2/models/identity/infer", {}),
    ("POST", "/v2/models/identity/infer", ADMIN),
    ("POST", "/v2/models/identity/infer", INFER),
    ("GET", "/v2/models/identity/infer", {}),
    ("GET", "/v2/models/identity/infer", INFER),
    ("POST", "/v2/repository/index", {}),
    ("POST", "/v2/repository/index", INFER),
    ("GET", "/v2/systemsharedmemory/status", {}),
    ("GET", "/v2/systemsharedmemory/status", INFER),
    ("GET", "/v2/trace/setting", {}),
    ("GET", "/v2/health/ready", {}),
    ("POST", "/v2/health/live", {}),
]


def _http(server: Server, method: str, path: str, headers: Mapping[str, str]) -> Any:
    """``(status, error message or the reply's JSON)``; a refusal's body is compared whole."""
    body = json.dumps(INFER_BODY).encode() if method == "POST" and "infer" in path else None
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=body, method=method, headers=dict(headers)
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            status, payload = reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        status, payload = exc.code, exc.read()
    parsed = json.loads(payload) if payload else None
    if status != 200:
        return status, parsed
    # Successes: what both servers answer alike (model configs and metadata differ in detail).
    if path.endswith("/infer"):
        return status, parsed["outputs"][0]["data"]
    if path.endswith("/stats"):
        return status, [entry["name"] for entry in parsed["model_stats"]]
    if path.endswith("/index"):
        return status, [(entry["name"], entry["state"]) for entry in parsed]
    return status, parsed.get("name") if isinstance(parsed, dict) else parsed


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    HTTP_CASES,
    ids=[f"{m} {p} {'+'.join(h) or 'no header'}" for m, p, h in HTTP_CASES],
)
def test_http_answers_match(
    servers: tuple[Server, Server], method: str, path: str, headers: Mapping[str, str]
) -> None:
    triton, reference = servers
    expected = _http(triton, method, path, headers)
    assert _http(reference, method, path, headers) == expected


def test_http_refusal_text_is_tritons(servers: tuple[Server, Server]) -> None:
    for server in servers:
        assert _http(server, "GET", "/v2", {}) == (
            403,
            {"error": "This API is restricted, expecting header 'admin-key'"},
        )
        # /metrics has no restriction in either.
        assert "nv_inference_count" in server.metrics_text()


# ------------------------------------------------------------------------------ gRPC


def _one_input() -> list[Any]:
    tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    return [tensor]


Call = Callable[[Any, Mapping[str, str] | None], Any]
GRPC_CALLS: dict[str, Call] = {
    "live": lambda c, h: c.is_server_live(headers=h),
    "model ready": lambda c, h: c.is_model_ready("identity", headers=h),
    "server metadata": lambda c, h: c.get_server_metadata(headers=h).name,
    "model metadata": lambda c, h: c.get_model_metadata("identity", headers=h).name,
    "config": lambda c, h: c.get_model_config("identity", headers=h).config.name,
    "statistics": lambda c, h: [s.name for s in c.get_inference_statistics(headers=h).model_stats],
    "index": lambda c, h: [m.name for m in c.get_model_repository_index(headers=h).models],
    "shm status": lambda c, h: len(c.get_system_shared_memory_status(headers=h).regions),
    "infer": lambda c, h: c.infer("identity", _one_input(), headers=h).as_numpy("OUTPUT0").tolist(),
}
GRPC_CASES = [
    (name, headers) for name in GRPC_CALLS for headers in (None, ADMIN, GRPC_ADMIN, GRPC_INFER)
]


def _grpc(server: Server, certs: Certificates, name: str, headers: Mapping[str, str] | None) -> Any:
    client = grpcclient.InferenceServerClient(server.grpc_url, **certs.client())
    try:
        return "ok", GRPC_CALLS[name](client, headers)
    except InferenceServerException as exc:
        return exc.status(), exc.message()
    finally:
        client.close()


@pytest.mark.parametrize(
    ("name", "headers"),
    GRPC_CASES,
    ids=[f"{n} {'+'.join(h or ()) or 'no header'}" for n, h in GRPC_CASES],
)
def test_grpc_answers_match_over_mutual_tls(
    servers: tuple[Server, Server],
    certs: Certificates,
    name: str,
    headers: Mapping[str, str] | None,
) -> None:
    triton, reference = servers
    expected = _grpc(triton, certs, name, headers)
    assert _grpc(reference, certs, name, headers) == expected


def test_grpc_refusal_text_is_tritons(servers: tuple[Server, Server], certs: Certificates) -> None:
    for server in servers:
        assert _grpc(server, certs, "config", None) == (
            "StatusCode.UNAVAILABLE",
            "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'",
        )


def _stream_outcome(server: Server, certs: Certificates, headers: Mapping[str, str] | None) -> Any:
    client = grpcclient.InferenceServerClient(server.grpc_url, **certs.client())
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def collect(result: Any, error: Any) -> None:
        answers.put((result, error))

    client.start_stream(callback=collect, headers=headers)
    try:
        if headers:
            client.async_stream_infer("identity", _one_input())
        # Without the header both servers end the stream as it opens; nothing is sent.
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    if error is not None:
        return error.status(), error.message()
    return "ok", result.as_numpy("OUTPUT0").tolist()


@pytest.mark.parametrize("headers", [None, GRPC_INFER], ids=["no header", "infer key"])
def test_grpc_stream_answers_match(
    servers: tuple[Server, Server], certs: Certificates, headers: Mapping[str, str] | None
) -> None:
    triton, reference = servers
    assert _stream_outcome(reference, certs, headers) == _stream_outcome(triton, certs, headers)


@pytest.mark.parametrize("client", ["plain text", "no client certificate", "another CA"])
def test_clients_without_the_right_certificate_fail_on_both(
    servers: tuple[Server, Server], certs: Certificates, client: str
) -> None:
    kwargs = {
        "plain text": {},
        "no client certificate": certs.client(cert=False),
        "another CA": certs.client(stranger=True),
    }[client]
    for server in servers:
        refused = grpcclient.InferenceServerClient(server.grpc_url, **kwargs)
        with pytest.raises(InferenceServerException) as caught:
            refused.is_server_live(headers=GRPC_ADMIN, client_timeout=10)
        # The text is the client's own and names the port: only the status is comparable.
        assert caught.value.status() == "StatusCode.UNAVAILABLE", caught.value.message()
