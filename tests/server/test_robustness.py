"""No client misbehaviour and no server bug may take the server (or another request) down.

Abrupt disconnects cancel the waiting request (counted as CANCELED, spec §3.8 / §11 B23),
lying or truncated bodies are answered or dropped, and an exception inside a handler becomes a
500 ``{"error": ...}`` reply, checked in-process with aiohttp's test client.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from aiohttp.test_utils import RawTestServer, TestClient

from reference_server.app import ServerThread
from reference_server.core.server import CoreOptions, InferenceServer
from reference_server.frontends.http import HttpFrontend
from tests.server.conftest import SLOW_MODEL, raw_request, wait_until, write_model

INFER_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
).encode()


def _stats(server: ServerThread, model: str) -> dict[str, int]:
    status, _, body = raw_request(server.http_url, "GET", f"/v2/models/{model}/stats")
    assert status == 200, body
    entry = json.loads(body)["model_stats"][0]["inference_stats"]
    return {key: int(value["count"]) for key, value in entry.items()}


def _open_request(address: str, path: str, body: bytes) -> socket.socket:
    """Send a full request and leave the connection open without reading the answer."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), like a killed client."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


def _post_and_close(address: str, path: str, body: bytes, hold_s: float) -> None:
    sock = _open_request(address, path, body)
    time.sleep(hold_s)  # the scenario: the client holds the request open, then vanishes
    _reset(sock)


def test_disconnect_while_queued_cancels_the_request(
    repository: Path, start_server: object
) -> None:
    write_model(repository, "slow_cancel", SLOW_MODEL % 400, add_name=True)
    server = start_server(repository, ("slow_cancel",))  # type: ignore[operator]
    path = "/v2/models/slow_cancel/infer"
    # Two requests for a one-instance model: one executes (400 ms), the other waits in the
    # scheduler queue (pending gauge 1). Both clients then vanish: the executing request still
    # completes (cancellation is up to the backend), the queued one is dropped as CANCELED.
    first = _open_request(server.http_url, path, INFER_BODY)
    second = _open_request(server.http_url, path, INFER_BODY)
    pending = 'nv_inference_pending_request_count{model="slow_cancel",version="1"} 1'
    wait_until(lambda: pending in _metrics(server), 10, "one request queued")
    _reset(first)
    _reset(second)
    wait_until(lambda: _stats(server, "slow_cancel")["fail"] == 1, 20, "one failure counted")
    wait_until(lambda: _stats(server, "slow_cancel")["success"] == 1, 20, "one success counted")
    failures = 'nv_inference_request_failure{model="slow_cancel",reason="CANCELED",version="1"} 1'
    assert failures in _metrics(server)
    # The server still answers, on a new connection.
    assert raw_request(server.http_url, "POST", path, INFER_BODY)[0] == 200
    final = _stats(server, "slow_cancel")
    assert (final["success"], final["fail"]) == (2, 1)


def _metrics(server: ServerThread) -> str:
    import urllib.request

    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        return str(response.read().decode())


def test_truncated_body_lying_content_length_and_garbage(server: ServerThread) -> None:
    host, port = server.http_url.rsplit(":", 1)
    # Content-Length promises more than is sent, then the client vanishes.
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 1000\r\n\r\n" + INFER_BODY[:20]
        )
    # Not HTTP at all: aiohttp answers 400 and closes.
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
        reply = sock.recv(65536)
    assert reply == b"" or reply.split(b"\r\n", 1)[0].split()[1] == b"400"
    status, _, _ = raw_request(server.http_url, "GET", "/v2/health/ready")
    assert status == 200


def test_many_concurrent_clients_some_disconnecting(server: ServerThread) -> None:
    """Well-behaved requests succeed while others drop their connections mid-flight."""
    client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    array = np.ones((1, 16), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(array)
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0] * 16}]}
    ).encode()
    droppers = [
        threading.Thread(
            target=_post_and_close,
            args=(server.http_url, "/v2/models/identity_fp32/infer", body, 0.0),
        )
        for _ in range(20)
    ]
    for thread in droppers:
        thread.start()
    pending = [client.async_infer("identity_fp32", [tensor]) for _ in range(40)]
    results = [request.get_result(timeout=60) for request in pending]
    for thread in droppers:
        thread.join(30)
    client.close()
    for result in results:
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)


@pytest.mark.usefixtures("serves")
def test_handler_exception_becomes_500_json_in_process(repository: Path) -> None:
    """A bug in a core call is answered as a 500 error body; the next request is served."""

    async def scenario() -> None:
        core = InferenceServer(
            CoreOptions(model_repositories=(repository,), startup_models=("nobatch",))
        )
        core.start()
        calls = {"n": 0}
        real_metadata = core.model_metadata

        def flaky_metadata(name: str, version: str = "") -> dict[str, object]:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("injected failure")
            return real_metadata(name, version)

        core.model_metadata = flaky_metadata  # type: ignore[method-assign]
        frontend = HttpFrontend(core)
        try:
            async with TestClient(RawTestServer(frontend.handle)) as client:
                broken = await client.get("/v2/models/nobatch")
                assert broken.status == 500
                assert broken.headers["Content-Type"] == "application/json"
                body = await broken.json()
                # Nothing of the exception reaches the client (it may name files or internals).
                assert body == {
                    "error": "internal server error; the reference server's log has details"
                }
                healthy = await client.get("/v2/models/nobatch")
                assert healthy.status == 200
                assert (await healthy.json())["name"] == "nobatch"
                infer = await client.post(
                    "/v2/models/nobatch/infer",
                    data=json.dumps(
                        {
                            "inputs": [
                                {
                                    "name": "INPUT0",
                                    "shape": [2, 2],
                                    "datatype": "INT32",
                                    "data": [[1, 2], [3, 4]],
                                }
                            ]
                        }
                    ),
                )
                assert infer.status == 200
                assert (await infer.json())["outputs"][0]["data"] == [1, 2, 3, 4]
        finally:
            core.stop()

    asyncio.run(scenario())


@pytest.mark.usefixtures("serves")
def test_stopping_core_answers_unavailable(repository: Path) -> None:
    """After the core stops, inference is refused with 503, not a hang or a crash."""

    async def scenario() -> None:
        core = InferenceServer(
            CoreOptions(model_repositories=(repository,), startup_models=("nobatch",))
        )
        core.start()
        frontend = HttpFrontend(core)
        async with TestClient(RawTestServer(frontend.handle)) as client:
            await asyncio.get_running_loop().run_in_executor(None, core.stop)
            ready = await client.get("/v2/health/ready")
            assert ready.status == 400
            reply = await client.post(
                "/v2/models/nobatch/infer",
                data=json.dumps(
                    {
                        "inputs": [
                            {
                                "name": "INPUT0",
                                "shape": [2, 2],
                                "datatype": "INT32",
                                "data": [0] * 4,
                            }
                        ]
                    }
                ),
            )
            assert reply.status == 503
            assert "error" in await reply.json()

    asyncio.run(scenario())
