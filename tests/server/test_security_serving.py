"""gRPC over TLS (mutual or not) and restricted APIs, served and driven by the real tritonclient.

Two servers for the module: one with TLS and nothing restricted, one with mutual TLS and
restrictions on both protocols. The refusal texts are Triton 2.51's (read on the real binary;
``tests/differential/test_security_vs_triton.py`` compares the two servers directly).
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server.conftest import error_message, raw_request
from tests.support.certs import Certificates, write_certificates
from tests.support.real_triton import identity_model_config
from tests.support.servers import ReferenceServer

ADMIN = {"admin-key": "secret"}
INFER = {"infer-key": "abc"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "secret"}
GRPC_INFER = {"triton-grpc-protocol-infer-key": "abc"}
HTTP_REFUSED = "This API is restricted, expecting header '{}'"
GRPC_REFUSED = "This protocol is restricted, expecting header 'triton-grpc-protocol-{}'"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return write_certificates(tmp_path_factory.mktemp("certs"))


def _tls_options(certs: Certificates, *, mutual: bool) -> dict[str, Any]:
    return {
        "grpc_use_ssl": not mutual,
        "grpc_use_ssl_mutual": mutual,
        "grpc_server_cert": certs.server_cert,
        "grpc_server_key": certs.server_key,
        "grpc_root_cert": certs.ca,
    }


@pytest.fixture(scope="module")
def tls_server(
    certs: Certificates, tmp_path_factory: pytest.TempPathFactory, serves: None
) -> Iterator[ReferenceServer]:
    options = _tls_options(certs, mutual=False)
    with ReferenceServer(
        tmp_path_factory.mktemp("tls"), [identity_model_config()], options=options
    ) as server:
        yield server


@pytest.fixture(scope="module")
def guarded_server(
    certs: Certificates, tmp_path_factory: pytest.TempPathFactory, serves: None
) -> Iterator[ReferenceServer]:
    """Mutual TLS; HTTP and gRPC each restrict two groups of APIs with two different keys."""
    options = {
        **_tls_options(certs, mutual=True),
        "http_restricted_apis": (
            "metadata,model-config,statistics:admin-key=secret",
            "inference,trace:infer-key=abc",
        ),
        "grpc_restricted_protocols": (
            "health,model-config:admin-key=secret",
            "inference:infer-key=abc",
        ),
    }
    with ReferenceServer(
        tmp_path_factory.mktemp("guarded"), [identity_model_config()], options=options
    ) as server:
        yield server


def _grpc_failure(call: Any) -> tuple[str, str]:
    """``(status, message)`` of a tritonclient gRPC call that must fail."""
    with pytest.raises(InferenceServerException) as caught:
        call()
    return str(caught.value.status()), str(caught.value.message())


def _one_input() -> list[Any]:
    tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    return [tensor]


# ------------------------------------------------------------------------------ TLS


def test_tls_serves_tls_clients_only(tls_server: ReferenceServer, certs: Certificates) -> None:
    secure = grpcclient.InferenceServerClient(tls_server.grpc_url, **certs.client(cert=False))
    assert secure.is_server_live()
    assert secure.get_model_metadata("identity").name == "identity"
    plain = grpcclient.InferenceServerClient(tls_server.grpc_url)
    status, message = _grpc_failure(lambda: plain.is_server_live(client_timeout=10))
    assert status == "StatusCode.UNAVAILABLE", message
    # HTTP stays plain text, as in Triton.
    assert tls_server.http_status("GET", "/v2/health/ready")[0] == 200


def test_mutual_tls_needs_a_client_certificate_signed_by_the_root(
    guarded_server: ReferenceServer, certs: Certificates
) -> None:
    url = guarded_server.grpc_url
    client = grpcclient.InferenceServerClient(url, **certs.client())
    assert client.get_server_metadata().name == "triton"
    for refused in (
        grpcclient.InferenceServerClient(url),
        grpcclient.InferenceServerClient(url, **certs.client(cert=False)),
        grpcclient.InferenceServerClient(url, **certs.client(stranger=True)),
    ):
        with pytest.raises(InferenceServerException) as caught:
            refused.get_server_metadata(client_timeout=10)
        assert caught.value.status() == "StatusCode.UNAVAILABLE", caught.value.message()


# ------------------------------------------------------------------------------ HTTP


def test_http_restricted_api_needs_its_header(guarded_server: ReferenceServer) -> None:
    client = httpclient.InferenceServerClient(guarded_server.http_url)
    for call in (
        lambda headers: client.get_model_config("identity", headers=headers),
        lambda headers: client.get_server_metadata(headers=headers),
        lambda headers: client.get_inference_statistics(headers=headers),
    ):
        with pytest.raises(InferenceServerException) as caught:
            call(None)
        assert caught.value.status() == "403"
        assert caught.value.message() == HTTP_REFUSED.format("admin-key")
        with pytest.raises(InferenceServerException):
            call(INFER)  # the other group's header does not open this one
        assert call(ADMIN)
    # Header names match in any case, values exactly.
    assert client.get_model_config("identity", headers={"ADMIN-KEY": "secret"})
    with pytest.raises(InferenceServerException):
        client.get_model_config("identity", headers={"admin-key": "SECRET"})
    # Groups not listed need nothing.
    assert client.is_server_ready() and client.get_model_repository_index()


def test_http_refusal_comes_before_routing(guarded_server: ReferenceServer) -> None:
    url = guarded_server.http_url
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0] * 16}]}
    ).encode()
    infer = HTTP_REFUSED.format("infer-key")
    for method, path, refusal in (
        ("POST", "/v2/models/identity/infer", infer),
        ("GET", "/v2/models/identity/infer", infer),  # before "Method Not Allowed"
        ("GET", "/v2/models/nosuch/config", HTTP_REFUSED.format("admin-key")),  # before 404
        ("GET", "/v2/trace/setting", infer),  # not served here, but still restricted
    ):
        status, _, payload = raw_request(url, method, path, body if method == "POST" else None)
        assert (status, error_message(payload)) == (403, refusal), path
    status, _, payload = raw_request(url, "POST", "/v2/models/identity/infer", body, INFER)
    assert status == 200, payload
    assert json.loads(payload)["outputs"][0]["data"] == [0] * 16
    status, _, payload = raw_request(url, "GET", "/v2/models/identity/infer", None, INFER)
    assert (status, error_message(payload)) == (405, "Method Not Allowed")
    # /metrics has its own port and no restriction, as in Triton.
    assert "nv_inference_count" in guarded_server.metrics_text()


# ------------------------------------------------------------------------------ gRPC


def test_grpc_restricted_protocol_needs_its_metadata(
    guarded_server: ReferenceServer, certs: Certificates
) -> None:
    client = grpcclient.InferenceServerClient(guarded_server.grpc_url, **certs.client())
    refused = ("StatusCode.UNAVAILABLE", GRPC_REFUSED.format("admin-key"))
    assert _grpc_failure(lambda: client.get_model_config("identity")) == refused
    assert _grpc_failure(lambda: client.is_server_live()) == refused
    assert _grpc_failure(lambda: client.is_model_ready("identity")) == refused
    # Only the prefixed key counts (tritonserver prefixes the configured one).
    assert _grpc_failure(lambda: client.get_model_config("identity", headers=ADMIN)) == refused
    assert client.get_model_config("identity", headers=GRPC_ADMIN).config.name == "identity"
    assert client.is_server_live(headers=GRPC_ADMIN)
    infer_refused = ("StatusCode.UNAVAILABLE", GRPC_REFUSED.format("infer-key"))
    assert _grpc_failure(lambda: client.infer("identity", _one_input())) == infer_refused
    result = client.infer("identity", _one_input(), headers=GRPC_INFER)
    assert result.as_numpy("OUTPUT0").tolist() == [list(range(16))]
    # Not restricted over gRPC, though restricted over HTTP: each protocol has its own flags.
    assert client.get_server_metadata().name == "triton"


def test_grpc_restricted_stream_is_ended_before_reading(
    guarded_server: ReferenceServer, certs: Certificates
) -> None:
    client = grpcclient.InferenceServerClient(guarded_server.grpc_url, **certs.client())
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def collect(result: Any, error: Any) -> None:
        answers.put((result, error))

    # Refused as the stream opens: the error comes without a request sent.
    client.start_stream(callback=collect)
    try:
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert result is None
    assert (error.status(), error.message()) == (
        "StatusCode.UNAVAILABLE",
        GRPC_REFUSED.format("infer-key"),
    )
    client.start_stream(callback=collect, headers=GRPC_INFER)
    try:
        client.async_stream_infer("identity", _one_input())
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None and result.as_numpy("OUTPUT0").shape == (1, 16)


def test_grpc_health_check_is_in_the_health_group(
    guarded_server: ReferenceServer, certs: Certificates
) -> None:
    health = pytest.importorskip("grpc_health.v1.health_pb2")
    health_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
    credentials = grpc.ssl_channel_credentials(
        certs.ca.read_bytes(), certs.client_key.read_bytes(), certs.client_cert.read_bytes()
    )
    with grpc.secure_channel(guarded_server.grpc_url, credentials) as channel:
        stub = health_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Check(health.HealthCheckRequest(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert caught.value.details() == GRPC_REFUSED.format("admin-key")
        reply = stub.Check(
            health.HealthCheckRequest(), metadata=tuple(GRPC_ADMIN.items()), timeout=10
        )
        assert reply.status == health.HealthCheckResponse.SERVING
