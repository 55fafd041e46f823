"""Child-process checks of the hot-path HTTP client and the dispatcher's timer (gevent-patched).

``run_client_checks(name)`` runs ``python -m tests.load.client_driver NAME`` and returns the JSON
it prints last. Checks:

* ``outputs``: a reference server with an identity model (FP32 and INT32 inputs, batch 3); every
  payload goes through ``RawHttpInferClient`` and its response is decoded by tritonclient.
* ``errors``: the error kinds of the raw client beside geventhttpclient's pool and tritonclient's
  own exception (unknown model, wrong shape), and a refused connection.
* ``stub``: a socket server that closes every connection after one answer (a stale keep-alive),
  answers chunked, or hangs up half-way through a response.
* ``sleeper``: ``DeadlineSleeper`` never wakes before its deadline (timerfd and fallback).
"""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from tests.load.child import run_module
from tests.support.servers import write_model


def run_client_checks(name: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Run check ``name`` in a child process and return its JSON answer."""
    return run_module("tests.load.client_driver", name, timeout_s=timeout_s)


def _write_identity(repo: Path) -> None:
    write_model(
        repo,
        "ident",
        textwrap.dedent(
            """\
            name: "ident"
            backend: "identity"
            max_batch_size: 8
            input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
                    { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
            output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
                     { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
            """
        ),
    )


def _inputs(url: str, batch_size: int = 3) -> Any:
    from analyzer.load.clients import fetch_model_documents
    from analyzer.load.inputs import build_inputs

    metadata, config = fetch_model_documents("http", url, "ident")
    return build_inputs(metadata, config, batch_size=batch_size, seed=7, unique_payloads=4)


def check_outputs() -> dict[str, Any]:
    """Every payload's outputs, decoded by tritonclient, equal its inputs (identity model)."""
    import numpy as np
    import tritonclient.http as httpclient

    from analyzer.load.http_clients import RawHttpInferClient
    from tests.load.refserver import RefServer

    repo = Path(tempfile.mkdtemp(prefix="perfsweep-client-"))
    _write_identity(repo)
    out: dict[str, Any] = {"payloads": []}
    with RefServer(repo, ("ident",)) as srv:
        inputs = _inputs(srv.http_url)
        client = RawHttpInferClient(srv.http_url, inputs, concurrency=2)
        try:
            for index, payload in enumerate(inputs.payloads):
                for _ in range(2):  # the second goes on the kept-alive connection
                    status, headers, body = client.exchange(client._requests[index])
                    header_len = headers.get("inference-header-content-length")
                    result = httpclient.InferResult.from_response_body(
                        body, header_length=int(header_len) if header_len else None
                    )
                    out["payloads"].append(
                        {
                            "status": status,
                            "equal": all(
                                np.array_equal(
                                    result.as_numpy(name.replace("INPUT", "OUTPUT")), value
                                )
                                for name, value in payload.items()
                            ),
                            "shapes": [list(v.shape) for v in payload.values()],
                        }
                    )
                client.infer(index)  # the hot path itself: no exception on a 200
            out["idle_connections"] = len(client._idle)
        finally:
            client.close()
        out["payload_count"] = len(inputs.payloads)
    return out


def check_errors() -> dict[str, Any]:
    """Error kinds of the raw client, geventhttpclient's pool and tritonclient, side by side."""
    import dataclasses

    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from analyzer.load.http_clients import PooledHttpInferClient, RawHttpInferClient
    from analyzer.load.inputs import TensorSpec
    from analyzer.load.prepared import InferError
    from tests.load.refserver import RefServer
    from tests.support.real_triton import free_port

    repo = Path(tempfile.mkdtemp(prefix="perfsweep-client-"))
    _write_identity(repo)
    out: dict[str, Any] = {}
    with RefServer(repo, ("ident",)) as srv:
        good = _inputs(srv.http_url)
        cases = {
            "unknown_model": dataclasses.replace(good, model="no_such_model"),
            "wrong_shape": dataclasses.replace(
                good,
                specs=(TensorSpec("INPUT0", "FP32", (3, 5)), good.specs[1]),
                payloads=(
                    {
                        "INPUT0": np.zeros((3, 5), np.float32),
                        "INPUT1": good.payloads[0]["INPUT1"],
                    },
                ),
            ),
        }
        for case, inputs in cases.items():
            kinds: dict[str, str] = {}
            for name, cls in (("raw", RawHttpInferClient), ("pooled", PooledHttpInferClient)):
                client = cls(srv.http_url, inputs)
                try:
                    client.infer(0)
                    kinds[name] = "no error"
                except InferError as exc:
                    kinds[name] = str(exc)
                finally:
                    client.close()
            triton = httpclient.InferenceServerClient(srv.http_url)
            tensors = []
            for spec in inputs.specs:
                t = httpclient.InferInput(spec.name, list(spec.shape), spec.datatype)
                t.set_data_from_numpy(inputs.payloads[0][spec.name], binary_data=True)
                tensors.append(t)
            try:
                triton.infer(inputs.model, tensors)
                kinds["tritonclient"] = "no error"
            except InferenceServerException as exc:
                kinds["tritonclient"] = str(exc.message())
            finally:
                triton.close()
            out[case] = kinds
        closed = RawHttpInferClient(f"127.0.0.1:{free_port()}", good, timeout_s=5.0)
        try:
            closed.infer(0)
            out["refused"] = "no error"
        except OSError as exc:
            out["refused"] = type(exc).__name__
    return out


_OK_HEADER = b'{"model_name":"m","outputs":[]}'


def check_stub() -> dict[str, Any]:
    """Stale keep-alive connections, chunked bodies and half-sent responses."""
    import gevent
    import numpy as np
    from gevent.server import StreamServer

    from analyzer.load.http_clients import RawHttpInferClient
    from analyzer.load.inputs import InputSet, TensorSpec
    from analyzer.load.prepared import ResponseError

    seen = {"connections": 0, "requests": 0}
    mode = {"now": "close_after_one"}

    def handle(sock: Any, _address: Any) -> None:
        seen["connections"] += 1
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                more = sock.recv(65536)
                if not more:
                    return
                buf += more
            head, _, rest = buf.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            while len(rest) < length:
                rest += sock.recv(65536)
            buf = rest[length:]
            seen["requests"] += 1
            body = _OK_HEADER
            if mode["now"] == "chunked":
                half = len(body) // 2
                sock.sendall(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                    b"Inference-Header-Content-Length: %d\r\n\r\n"
                    % len(body)
                    + b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n"
                    % (half, body[:half], len(body) - half, body[half:])
                )
                continue
            if mode["now"] == "half":
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + body[:10])
                sock.close()
                return
            sock.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n"
                b"Inference-Header-Content-Length: %d\r\n\r\n" % (len(body), len(body)) + body
            )
            if mode["now"] == "close_after_one":
                gevent.sleep(0.01)
                sock.close()  # no "Connection: close": the client finds out on its next request
                return

    server = StreamServer(("127.0.0.1", 0), handle)
    server.start()
    url = f"127.0.0.1:{server.server_port}"
    inputs = InputSet(
        model="m",
        specs=(TensorSpec("INPUT0", "FP32", (1, 2)),),
        outputs=(),
        payloads=({"INPUT0": np.zeros((1, 2), np.float32)},),
        max_batch_size=0,
        batch_size=1,
    )
    out: dict[str, Any] = {}
    client = RawHttpInferClient(url, inputs)
    for _ in range(3):
        client.infer(0)
        gevent.sleep(0.05)  # the server has closed the idle connection by now
    out["stale"] = dict(seen)

    mode["now"] = "chunked"
    seen.update(connections=0, requests=0)
    status, _, body = client.exchange(client._requests[0])
    out["chunked"] = {"status": status, "body": body.decode(), **seen}
    client.infer(0)  # the connection stays usable after a chunked answer
    out["chunked"]["after"] = dict(seen)

    mode["now"] = "half"
    seen.update(connections=0, requests=0)
    try:
        client.infer(0)
        out["half"] = {"error": "no error"}
    except ResponseError as exc:
        out["half"] = {"error": str(exc)}
    out["half"].update(seen)
    client.close()
    server.stop()
    return out


def check_sleeper() -> dict[str, Any]:
    """Waits on both paths never end early, and the timerfd path is the one used on Linux."""
    import time

    import gevent

    from analyzer.load.timing import DeadlineSleeper

    out: dict[str, Any] = {}
    for name, use in (("timerfd", True), ("gevent", False)):
        sleeper = DeadlineSleeper(use_timerfd=use)
        early = 0
        waits = 0

        def other_work() -> None:
            for _ in range(200):
                gevent.sleep(0.0005)

        busy = gevent.spawn(other_work)  # the hub has other greenlets to serve meanwhile
        start = time.perf_counter()
        for i in range(200):
            deadline = start + 0.0007 * (i + 1)
            sleeper.sleep_until(deadline)
            waits += 1
            early += time.perf_counter() < deadline
        sleeper.sleep_until(time.perf_counter() - 1.0)  # a deadline in the past returns at once
        busy.join()
        out[name] = {"precise": sleeper.precise, "waits": waits, "early": early}
        sleeper.close()
        out[name]["closed"] = not sleeper.precise
    return out


CHECKS = {
    "outputs": check_outputs,
    "errors": check_errors,
    "stub": check_stub,
    "sleeper": check_sleeper,
}


def main() -> None:
    """Child side: run one check, print its answer."""
    import analyzer.load._gevent  # noqa: F401  (patch before any socket exists)

    print(json.dumps(CHECKS[sys.argv[1]]()), flush=True)


if __name__ == "__main__":
    main()
