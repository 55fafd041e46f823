"""KServe v2 inference clients for the hot path, HTTP (binary tensors) and gRPC.

Both are built from an ``InputSet`` once and then send pre-built requests:

* HTTP: ``tritonclient.http`` serialises each payload once (binary tensor extension,
  ``Inference-Header-Content-Length``), and the body is POSTed with geventhttpclient's
  ``HTTPClient`` (the connection pool tritonclient.http itself is built on) with ``concurrency``
  keep-alive connections. Responses are checked for status; the first one is fully parsed.
* gRPC: ``tritonclient.grpc`` unary ``infer`` with pre-built ``InferInput`` objects. The process
  must have called ``grpc.experimental.gevent.init_gevent()`` before this client is created
  (``analyzer.load.gevent_setup`` does it), or calls deadlock.

Both also read metadata, config and statistics, so one code path serves any KServe v2 server.
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
import json
from collections.abc import Callable
from typing import Any, Protocol

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from geventhttpclient import HTTPClient
from tritonclient.utils import InferenceServerException

from analyzer.errors import TargetError
from analyzer.load.inputs import InputSet


class InferError(Exception):
    """One inference failed; ``str(exc)`` is the error kind recorded (status and message head)."""


class InferClient(Protocol):
    """Sends one inference request and waits for its response."""

    def infer(self, payload_index: int) -> None:
        """Send payload ``payload_index % n``; raise ``InferError`` on a failed inference."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def _close_grpc(client: grpcclient.InferenceServerClient) -> None:
    """Close a tritonclient.grpc client exactly once.

    Its ``__del__`` closes again; a second close that runs at interpreter shutdown, after the
    gevent hub is gone, hangs inside grpc's gevent channel accounting. So close now and make
    the destructor's call a no-op.
    """
    client.close()
    setattr(client, "close", lambda: None)  # noqa: B010 - shadow the bound method on purpose


def _split_url(url: str) -> tuple[str, int]:
    if "://" in url:
        url = url.split("://", 1)[1]
    host, _, port = url.rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise TargetError(f"expected HOST:PORT for the target, got {url!r}")
    return host, int(port)


class HttpInferClient:
    """Pre-serialised KServe v2 HTTP requests over a keep-alive connection pool."""

    def __init__(
        self, url: str, inputs: InputSet, concurrency: int = 1, timeout_s: float = 60.0
    ) -> None:
        host, port = _split_url(url)
        self._client = HTTPClient(
            host,
            port,
            concurrency=concurrency,
            connection_timeout=timeout_s,
            network_timeout=timeout_s,
        )
        self._path = f"/v2/models/{inputs.model}/infer"
        self._requests = [self._build(inputs, p) for p in range(len(inputs.payloads))]
        self._checked = False

    @staticmethod
    def _build(inputs: InputSet, index: int) -> tuple[bytes, dict[str, str]]:
        payload = inputs.payloads[index]
        tensors = []
        for spec in inputs.specs:
            t = httpclient.InferInput(spec.name, list(spec.shape), spec.datatype)
            t.set_data_from_numpy(payload[spec.name], binary_data=True)
            tensors.append(t)
        outputs = [
            httpclient.InferRequestedOutput(name, binary_data=True) for name in inputs.outputs
        ]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            tensors, outputs=outputs or None
        )
        headers = {"Content-Type": "application/octet-stream"}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        return bytes(body), headers

    def infer(self, payload_index: int) -> None:
        """POST one request; raise ``InferError`` on a non-200 answer."""
        body, headers = self._requests[payload_index % len(self._requests)]
        with self._client.request("POST", self._path, body=body, headers=headers) as resp:
            data = resp.read()
            status = resp.status_code
            header_len = resp.get("inference-header-content-length")
        if status != 200:
            try:
                message = json.loads(data).get("error", "")
            except ValueError:
                message = data[:80].decode("utf-8", "replace")
            raise InferError(f"HTTP {status}: {message}")
        if not self._checked:  # parse one response fully: a garbled protocol fails loudly, once
            httpclient.InferenceServerClient.parse_response_body(
                data, header_length=int(str(header_len)) if header_len else None
            )
            self._checked = True

    def close(self) -> None:
        """Close all pooled connections."""
        self._client.close()


class GrpcInferClient:
    """tritonclient.grpc unary inference (needs gevent-initialised grpc)."""

    def __init__(self, url: str, inputs: InputSet, timeout_s: float = 60.0) -> None:
        self._client = grpcclient.InferenceServerClient(url)
        self._model = inputs.model
        self._timeout_s = timeout_s
        self._requests = []
        outputs = [grpcclient.InferRequestedOutput(name) for name in inputs.outputs] or None
        for payload in inputs.payloads:
            tensors = []
            for spec in inputs.specs:
                t = grpcclient.InferInput(spec.name, list(spec.shape), spec.datatype)
                t.set_data_from_numpy(payload[spec.name])
                tensors.append(t)
            self._requests.append((tensors, outputs))

    def infer(self, payload_index: int) -> None:
        """One unary ModelInfer call; raise ``InferError`` on failure."""
        tensors, outputs = self._requests[payload_index % len(self._requests)]
        try:
            self._client.infer(
                self._model, tensors, outputs=outputs, client_timeout=self._timeout_s
            )
        except InferenceServerException as exc:
            raise InferError(f"gRPC {exc.status()}: {exc.message()}") from exc

    def close(self) -> None:
        """Close the channel."""
        _close_grpc(self._client)


def make_client(protocol: str, url: str, inputs: InputSet, concurrency: int) -> InferClient:
    """A hot-path client for ``protocol`` ("http" or "grpc")."""
    if protocol == "grpc":
        return GrpcInferClient(url, inputs)
    return HttpInferClient(url, inputs, concurrency=concurrency)


def fetch_model_documents(protocol: str, url: str, model: str) -> tuple[dict, dict]:
    """Metadata and config JSON of ``model`` over ``protocol``; TargetError when unreachable."""
    try:
        if protocol == "grpc":
            g = grpcclient.InferenceServerClient(url)
            try:
                if not g.is_model_ready(model):
                    raise TargetError(f"model {model!r} is not ready on {url} (gRPC)")
                metadata: dict = g.get_model_metadata(model, as_json=True)
                config: dict = g.get_model_config(model, as_json=True).get("config", {})
            finally:
                _close_grpc(g)
        else:
            h = httpclient.InferenceServerClient(url)
            try:
                if not h.is_model_ready(model):
                    raise TargetError(
                        f"model {model!r} is not ready on {url}: load it first "
                        f"(POST /v2/repository/models/{model}/load) or check the name"
                    )
                metadata = h.get_model_metadata(model)
                config = h.get_model_config(model)
            finally:
                h.close()
    except TargetError:
        raise
    except (InferenceServerException, OSError) as exc:
        raise TargetError(f"cannot reach {url} over {protocol}: {exc}") from exc
    return metadata, config


class GrpcStatsSource:
    """Fetches the statistics document over gRPC (``as_json``); call ``close`` when done."""

    def __init__(self, url: str, model: str) -> None:
        self._client = grpcclient.InferenceServerClient(url)
        self._model = model

    def __call__(self) -> dict[str, Any]:
        doc: dict[str, Any] = self._client.get_inference_statistics(self._model, as_json=True)
        return doc

    def close(self) -> None:
        """Close the channel."""
        _close_grpc(self._client)


def stats_source(protocol: str, url: str, model: str) -> Callable[[], dict[str, Any]]:
    """A statistics fetcher over ``protocol`` (used by ``ServerScraper``)."""
    if protocol == "grpc":
        return GrpcStatsSource(url, model)
    from analyzer.server_stats import http_stats_source

    return http_stats_source(url, model)
