"""KServe v2 inference clients for the hot path, HTTP (binary tensors) and gRPC.

This module holds the gRPC client, :func:`make_client` and the server documents and statistics
sources; the HTTP clients are :mod:`analyzer.load.http_clients`, the prepared requests and what
every client shares :mod:`analyzer.load.prepared`.

Both send pre-built requests. A process builds them once from its ``InputSet``
(:func:`prepare_requests`, one request per distinct payload, each with that payload's own tensor
shapes) and every user's client shares them (``make_client(..., prepared=...)``): building them
per user made a large rotation cost the generator its schedule.

* HTTP (``RawHttpInferClient``, the default): ``tritonclient.http`` serialises each payload once
  (binary tensor extension, ``Inference-Header-Content-Length``) and the whole HTTP/1.1 request
  (request line, headers and body) is built once per payload as one ``bytes``. Each inference is
  one ``sendall`` on a pooled keep-alive gevent socket and a read of the status line, the few
  headers it needs (``Content-Length``, ``Transfer-Encoding``, ``Connection``,
  ``Inference-Header-Content-Length``) and the body. The first response is parsed fully by
  ``tritonclient.http``, so a garbled protocol fails loudly, once. This path costs about a third
  of geventhttpclient's per request (``benchmarks/README.md``, generator vs perf_analyzer).
* HTTP (``PooledHttpInferClient``, ``http_client="geventhttpclient"``): the same bodies POSTed
  with geventhttpclient's ``HTTPClient`` (the pool tritonclient.http itself is built on); kept
  for A/B comparisons.
* gRPC: ``tritonclient.grpc`` unary ``infer`` with pre-built ``InferInput`` objects. The process
  must have called ``grpc.experimental.gevent.init_gevent()`` before this client is created
  (``analyzer.load._gevent`` does it), or calls deadlock.

With traffic classes (a priority mix, ``analyzer.load.classes``) ``infer(payload, klass)``
sends the class's ``priority``/``timeout`` parameters as tritonclient does: HTTP requests are
pre-built once per class that sends any (the JSON header's ``parameters``), gRPC passes them to
``infer`` (the request ``parameters`` map).

A sequence-batched model (``prepare_requests(..., sequence=True)``) gets its three sequence
parameters (``sequence_id``, ``sequence_start``, ``sequence_end``, from a
:class:`~analyzer.load.sequences.SequenceStep`) on every request, as tritonclient sends them:
over HTTP the binary tensor tail of each payload is built once and only the small JSON header
is built per request (:class:`HttpParts`, the class's ``priority``/``timeout`` merged in);
gRPC passes them to ``infer``. Stateless models keep their fully pre-built requests.

A failed inference raises ``InferError("HTTP <status>: <server message>")`` (or ``gRPC ...``);
network failures raise ``OSError`` (refused, reset, timed out). Both are recorded by kind.
Metadata, config and statistics are read with tritonclient, so one code path serves any KServe v2
server.
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from analyzer.config.access import PLAIN, ServerAccess, access_denied
from analyzer.errors import TargetError
from analyzer.load.classes import RequestClass
from analyzer.load.http_clients import PooledHttpInferClient, RawHttpInferClient
from analyzer.load.inputs import InputSet
from analyzer.load.prepared import (
    HTTP_CLIENTS,
    InferClient,
    InferError,
    PreparedRequests,
    _close_grpc,
    grpc_requests,
    prepare_requests,
)
from analyzer.load.sequences import SequenceStep


class GrpcInferClient:
    """tritonclient.grpc unary inference (needs gevent-initialised grpc)."""

    def __init__(
        self,
        url: str,
        inputs: InputSet,
        timeout_s: float = 60.0,
        requests: Sequence[tuple[list[Any], list[Any] | None]] | None = None,
        classes: Sequence[RequestClass] = (),
        access: ServerAccess = PLAIN,
    ) -> None:
        self._client = grpcclient.InferenceServerClient(url, **access.grpc_options())
        self._headers = access.grpc_metadata() or None
        self._model = inputs.model
        self._timeout_s = timeout_s
        self._requests = requests if requests is not None else grpc_requests(inputs)
        self._class_kwargs = [c.infer_kwargs() for c in classes] or [{}]

    def infer(
        self, payload_index: int, klass: int = 0, sequence: SequenceStep | None = None
    ) -> None:
        """One unary ModelInfer call (with ``sequence``'s parameters); raise ``InferError`` on
        failure."""
        tensors, outputs = self._requests[payload_index % len(self._requests)]
        try:
            self._client.infer(
                self._model,
                tensors,
                outputs=outputs,
                client_timeout=self._timeout_s,
                headers=self._headers,
                **(sequence.parameters() if sequence is not None else {}),
                **self._class_kwargs[klass],
            )
        except InferenceServerException as exc:
            raise InferError(f"gRPC {exc.status()}: {exc.message()}") from exc

    def close(self) -> None:
        """Close the channel."""
        _close_grpc(self._client)


def make_client(
    protocol: str,
    url: str,
    inputs: InputSet,
    concurrency: int,
    http_client: str = "raw",
    prepared: PreparedRequests | None = None,
    classes: Sequence[RequestClass] = (),
    sequence: bool = False,
    access: ServerAccess = PLAIN,
    tls: bool = False,
) -> InferClient:
    """A hot-path client for ``protocol`` ("http" or "grpc").

    Args:
        protocol: "http" or "grpc".
        url: ``host:port``.
        inputs: the payloads.
        concurrency: HTTP connections at most.
        http_client: one of ``HTTP_CLIENTS`` (HTTP only).
        prepared: requests built once for the process (:func:`prepare_requests`); used when
            they were built for this protocol, client, URL and classes. Without them the client
            takes the ones ``inputs`` holds for these arguments (built on first use), so users
            that share an ``InputSet`` share its requests.
        classes: traffic classes (``infer(payload, klass)`` sends class ``klass``'s priority
            and timeout); empty: one class that sends neither.
        sequence: a sequence-batched model: ``infer`` takes each request's
            :class:`~analyzer.load.sequences.SequenceStep` and sends its parameters.
        access: TLS files and headers (gRPC: TLS when it has TLS files).
        tls: HTTP over TLS (the target's URL is ``https://``).
    """
    kind = "" if protocol == "grpc" else http_client
    classes = tuple(classes)
    headers = access.http_headers()
    if prepared is None or (
        prepared.protocol,
        prepared.http_client,
        prepared.url,
        prepared.classes,
        prepared.sequence,
        prepared.headers,
    ) != (protocol, kind, url, classes, sequence, tuple(headers.items())):
        prepared = prepare_requests(
            protocol, url, inputs, http_client, classes, sequence, headers=headers
        )
    shared = prepared.items
    if protocol == "grpc":
        return GrpcInferClient(url, inputs, requests=shared, classes=classes, access=access)
    tls_context = access.ssl_context() if tls else None
    by_class = prepared.by_class or None
    parts = shared if sequence else None
    if http_client == "geventhttpclient":
        return PooledHttpInferClient(
            url,
            inputs,
            concurrency=concurrency,
            requests=None if sequence else shared,
            class_requests=by_class,
            parts=parts,
            classes=classes,
            tls=access.http_tls_options() if tls else None,
            headers=headers,
        )
    if http_client != "raw":
        raise ValueError(f"http_client must be one of {HTTP_CLIENTS}, not {http_client!r}")
    return RawHttpInferClient(
        url,
        inputs,
        concurrency=concurrency,
        requests=None if sequence else shared,
        class_requests=by_class,
        parts=parts,
        classes=classes,
        tls=tls_context,
    )


def fetch_model_documents(
    protocol: str, url: str, model: str, access: ServerAccess = PLAIN, tls: bool = False
) -> tuple[dict, dict]:
    """Metadata and config JSON of ``model`` over ``protocol`` (``tls``: HTTP over TLS).

    Raises:
        AccessDeniedError: The server refused the credentials (a restricted API, a TLS
            handshake), naming the API.
        TargetError: The server cannot be reached or has no such model ready.
    """
    headers = (access.grpc_metadata() if protocol == "grpc" else access.http_headers()) or None
    if protocol == "grpc":
        client: Any = grpcclient.InferenceServerClient(url, **access.grpc_options())
        close: Callable[[], None] = lambda: _close_grpc(client)  # noqa: E731
        extra: dict[str, Any] = {"as_json": True}
    else:
        tls_options = access.http_tls_options() if tls else {}
        client = httpclient.InferenceServerClient(url, **tls_options)
        close, extra = client.close, {}
    try:
        # Metadata first: it raises with the server's own message (a restricted API, a proxy's
        # 401), where the readiness check would only answer False.
        failure: Exception | None = None
        try:
            metadata: dict = client.get_model_metadata(model, headers=headers, **extra)
        except (InferenceServerException, OSError) as exc:
            if is_refusal(exc):
                raise access_denied("metadata", f"{protocol} {url}: {exc}", access) from exc
            failure, metadata = exc, {}
        if not client.is_model_ready(model, headers=headers):  # no answer: raises
            raise TargetError(
                f"model {model!r} is not ready on {url} ({protocol}): load it first "
                f"(POST /v2/repository/models/{model}/load) or check the name"
            )
        if failure is not None:
            raise failure
        try:
            config: dict = client.get_model_config(model, headers=headers, **extra)
        except (InferenceServerException, OSError) as exc:
            if is_refusal(exc):
                raise access_denied("model-config", f"{protocol} {url}: {exc}", access) from exc
            raise
    except TargetError:
        raise
    except (InferenceServerException, OSError) as exc:
        hint = ""
        if protocol == "grpc" and access.grpc_tls and not access.ssl_cert:
            hint = (
                " (over TLS: a server that wants a client certificate closes the connection "
                "without one; give --ssl-cert and --ssl-key)"
            )
        raise TargetError(f"cannot reach {url} over {protocol}: {exc}{hint}") from exc
    finally:
        close()
    if protocol == "grpc":
        config = config.get("config", {})
    return metadata, config


def is_refusal(exc: BaseException) -> bool:
    """Whether a client error is a refusal for want of credentials: Triton's restricted API or
    protocol ("... is restricted, expecting header ..."), HTTP 401/403 from a proxy, or a TLS
    handshake the other side did not accept."""
    text = str(exc)
    if isinstance(exc, ssl.SSLError) or "restricted" in text or "handshake" in text.lower():
        return True
    status = exc.status() if isinstance(exc, InferenceServerException) else None
    return str(status) in (
        "401",
        "403",
        "StatusCode.UNAUTHENTICATED",
        "StatusCode.PERMISSION_DENIED",
    )


class GrpcStatsSource:
    """Fetches the statistics document over gRPC (``as_json``); call ``close`` when done."""

    def __init__(self, url: str, model: str, access: ServerAccess = PLAIN) -> None:
        self._client = grpcclient.InferenceServerClient(url, **access.grpc_options())
        self._headers = access.grpc_metadata() or None
        self._model = model

    def __call__(self) -> dict[str, Any]:
        doc: dict[str, Any] = self._client.get_inference_statistics(
            self._model, headers=self._headers, as_json=True
        )
        return doc

    def close(self) -> None:
        """Close the channel."""
        _close_grpc(self._client)


def stats_source(
    protocol: str, url: str, model: str, access: ServerAccess = PLAIN
) -> Callable[[], dict[str, Any]]:
    """A statistics fetcher over ``protocol`` (used by ``ServerScraper``; HTTP: ``url`` with its
    scheme for TLS)."""
    if protocol == "grpc":
        return GrpcStatsSource(url, model, access)
    from analyzer.target.server_stats import http_stats_source
    from analyzer.target.transport import UrllibTransport

    return http_stats_source(url, model, transport=UrllibTransport(access))
