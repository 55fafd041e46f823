"""What every inference client shares, and the requests a process builds once.

:class:`InferError` and the :class:`InferClient` protocol; the HTTP request's parts
(:class:`HttpParts`, one ``bytes`` per payload) and errors; and :func:`prepare_requests`:
one request per distinct payload of an ``InputSet`` (raw HTTP, geventhttpclient bodies or
gRPC), shared by every user's client of the process (:class:`PreparedRequests`).
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from analyzer.errors import TargetError
from analyzer.load.classes import RequestClass
from analyzer.load.inputs import InputSet
from analyzer.load.sequences import SequenceStep


class InferError(Exception):
    """One inference failed; ``str(exc)`` is the error kind recorded (status and message head)."""


class InferClient(Protocol):
    """Sends one inference request and waits for its response."""

    def infer(
        self, payload_index: int, klass: int = 0, sequence: SequenceStep | None = None
    ) -> None:
        """Send payload ``payload_index % n`` as a request of traffic class ``klass`` (and of
        ``sequence``, a sequence model's step: required for the clients made for one); raise
        ``InferError`` on a failed inference."""
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


def _request_body(
    inputs: InputSet, index: int, klass: RequestClass | None = None, shm: Any = None
) -> tuple[bytes, dict[str, str]]:
    """Payload ``index`` as a binary-extension body and the headers it needs, with ``klass``'s
    ``priority``/``timeout`` parameters (tritonclient's own request body); with ``shm`` (an
    HTTP :class:`~analyzer.load.shm.ShmInputs`) a JSON-only body naming its region instead.

    The shape sent is the payload's own (a ``distribution`` or a data file mixes shapes), not
    the first payload's in ``inputs.specs``.
    """
    payload = inputs.payloads[index]
    tensors = []
    if shm is not None:
        tensors = list(shm.inputs(index))
    for spec in inputs.specs if shm is None else ():
        t = httpclient.InferInput(spec.name, list(payload[spec.name].shape), spec.datatype)
        t.set_data_from_numpy(payload[spec.name], binary_data=True)
        tensors.append(t)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in inputs.outputs]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        tensors, outputs=outputs or None, **(klass.infer_kwargs() if klass else {})
    )
    headers = {"Content-Type": "application/octet-stream" if json_size else "application/json"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return bytes(body), headers


@dataclass(frozen=True)
class HttpParts:
    """One payload's request split where per-request parameters go (a sequence model's).

    ``header`` is the JSON inference header tritonclient builds (inputs, outputs and their
    ``binary_data_size``), without request parameters; ``tail`` the binary tensor data after
    it, built once.
    """

    header: dict[str, Any]
    tail: bytes

    def body(self, parameters: dict[str, Any]) -> tuple[bytes, int]:
        """The request body with ``parameters`` (sequence, priority, timeout) in its header,
        and the header's length (``Inference-Header-Content-Length``)."""
        header = self.header
        if parameters:
            header = {**header, "parameters": {**header.get("parameters", {}), **parameters}}
        text = json.dumps(header).encode()
        return text + self.tail, len(text)


def _request_parts(inputs: InputSet, index: int, shm: Any = None) -> HttpParts:
    """Payload ``index`` as tritonclient's body without parameters, split at its JSON header."""
    body, headers = _request_body(inputs, index, shm=shm)
    size = int(headers.get("Inference-Header-Content-Length", len(body)))
    return HttpParts(json.loads(body[:size]), body[size:])


def _error_kind(status: int, data: bytes) -> str:
    """``HTTP <status>: <message>``: the server's ``{"error": ...}`` or the head of the body."""
    try:
        message = json.loads(data).get("error", "")
    except (ValueError, AttributeError):
        message = data[:80].decode("utf-8", "replace")
    return f"HTTP {status}: {message}"


def _check_first(data: bytes, header_length: str | None) -> None:
    """Parse one response fully with tritonclient: a garbled protocol fails loudly, once."""
    httpclient.InferenceServerClient.parse_response_body(
        data, header_length=int(header_length) if header_length else None
    )


class ResponseError(OSError):
    """The server's bytes are not an HTTP/1.1 response this client can read (or it hung up)."""


#: ``http_client`` names: the default raw client, and geventhttpclient's pool (A/B comparisons).
HTTP_CLIENTS = ("raw", "geventhttpclient")


def _per_payload(inputs: InputSet, build: Callable[[int], Any]) -> list[Any]:
    """``build(index)`` once per distinct payload: a repeat in the rotation is the same dict
    object as the payload it repeats, and gets the same request object."""
    built: dict[int, Any] = {}
    out = []
    for index, payload in enumerate(inputs.payloads):
        key = id(payload)
        if key not in built:
            built[key] = build(index)
        out.append(built[key])
    return out


def raw_http_requests(
    url: str,
    inputs: InputSet,
    klass: RequestClass | None = None,
    shm: Any = None,
    headers: Mapping[str, str] | None = None,
) -> list[bytes]:
    """Whole HTTP/1.1 requests (request line, headers, body) for ``url``, one per rotation slot,
    with ``klass``'s priority and timeout parameters (``shm``: inputs in shared memory) and the
    access's ``headers``."""
    head = raw_http_head(url, inputs.model, headers)

    def build(index: int) -> bytes:
        body, headers = _request_body(inputs, index, klass, shm)
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return f"{head}{lines}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body

    return _per_payload(inputs, build)


def raw_http_head(url: str, model: str, headers: Mapping[str, str] | None = None) -> str:
    """The request line and the fixed headers of every inference request to ``url``."""
    host, port = _split_url(url)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Connection: keep-alive\r\n{extra}"
    )


def http_bodies(
    inputs: InputSet,
    klass: RequestClass | None = None,
    shm: Any = None,
    headers: Mapping[str, str] | None = None,
) -> list[tuple[bytes, dict[str, str]]]:
    """Binary-extension bodies and their headers, one per rotation slot (with ``klass``'s
    parameters and the access's ``headers``; ``shm``: JSON-only bodies naming the shared-memory
    region)."""

    def build(index: int) -> tuple[bytes, dict[str, str]]:
        body, own = _request_body(inputs, index, klass, shm)
        return body, {**(headers or {}), **own}

    return _per_payload(inputs, build)


def http_parts(inputs: InputSet, shm: Any = None) -> list[HttpParts]:
    """A sequence model's HTTP payloads, one per rotation slot: the JSON header to complete per
    request and the binary tail built once (none with ``shm``)."""
    return _per_payload(inputs, lambda index: _request_parts(inputs, index, shm))


def grpc_requests(inputs: InputSet, shm: Any = None) -> list[tuple[list[Any], list[Any] | None]]:
    """``(InferInput list, requested outputs)`` per rotation slot, each with its payload's shapes
    (``shm``: a gRPC :class:`~analyzer.load.shm.ShmInputs`, the inputs naming its region)."""
    outputs = [grpcclient.InferRequestedOutput(name) for name in inputs.outputs] or None

    def build(index: int) -> tuple[list[Any], list[Any] | None]:
        if shm is not None:
            return list(shm.inputs(index)), outputs
        payload = inputs.payloads[index]
        tensors = []
        for spec in inputs.specs:
            array = payload[spec.name]
            t = grpcclient.InferInput(spec.name, list(array.shape), spec.datatype)
            t.set_data_from_numpy(array)
            tensors.append(t)
        return tensors, outputs

    return _per_payload(inputs, build)


@dataclass(frozen=True)
class PreparedRequests:
    """One process's requests for one target and ``InputSet``, built once, read by every user.

    ``items`` is in rotation order, one per payload slot: whole HTTP requests (``raw``), body
    and headers (``geventhttpclient``), or gRPC input objects (``grpc``). With traffic
    ``classes``, HTTP requests are built per class (``by_class``, by class index; a class that
    sends no parameter shares ``items``); gRPC sends each class's parameters per call. For a
    ``sequence`` model the HTTP items are :class:`HttpParts` (completed per request).
    """

    protocol: str
    http_client: str
    url: str
    items: tuple[Any, ...]
    classes: tuple[RequestClass, ...] = ()
    by_class: tuple[tuple[Any, ...], ...] = ()
    sequence: bool = False
    #: The access's headers, in every HTTP request.
    headers: tuple[tuple[str, str], ...] = ()


def prepare_requests(
    protocol: str,
    url: str,
    inputs: InputSet,
    http_client: str = "raw",
    classes: Sequence[RequestClass] = (),
    sequence: bool = False,
    shm: Any = None,
    headers: Mapping[str, str] | None = None,
) -> PreparedRequests:
    """The requests ``make_client`` would build for these arguments, built once per
    ``InputSet`` (kept in its ``request_cache``) and shared by every client made from it.

    ``sequence``: a sequence-batched model (every request carries its sequence parameters).
    ``shm``: an :class:`~analyzer.load.shm.ShmInputs` of ``inputs`` registered with the
    target over ``protocol``: requests name its region instead of carrying tensor data.
    """
    kind = "" if protocol == "grpc" else http_client
    classes = tuple(classes)
    extra = tuple((headers or {}).items())
    key: tuple[Any, ...] = (protocol, kind, url, classes) if classes else (protocol, kind, url)
    if extra:
        key += (extra,)
    if sequence:
        key += ("sequence",)
    if shm is not None:
        key += ("shm", shm.region_name)
    cached = inputs.request_cache.get(key)
    if cached is not None:
        assert isinstance(cached, PreparedRequests)
        return cached
    if protocol != "grpc" and http_client not in HTTP_CLIENTS:
        raise ValueError(f"http_client must be one of {HTTP_CLIENTS}, not {http_client!r}")

    def build(klass: RequestClass | None) -> list[Any]:
        if protocol == "grpc":
            return grpc_requests(inputs, shm)
        if http_client == "geventhttpclient":
            return http_bodies(inputs, klass, shm, headers)
        return raw_http_requests(url, inputs, klass, shm, headers)

    by_class: tuple[tuple[Any, ...], ...] = ()
    if sequence and protocol != "grpc":  # the header is completed per request
        items = tuple(http_parts(inputs, shm))
    else:
        items = tuple(build(None))
        if classes and protocol != "grpc":  # gRPC sends the parameters per call
            by_class = tuple(items if not c.infer_kwargs() else tuple(build(c)) for c in classes)
    prepared = PreparedRequests(protocol, kind, url, items, classes, by_class, sequence, extra)
    inputs.request_cache[key] = prepared
    return prepared
