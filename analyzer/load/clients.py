"""KServe v2 inference clients for the hot path, HTTP (binary tensors) and gRPC.

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
import json
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from gevent.lock import BoundedSemaphore
from geventhttpclient import HTTPClient
from tritonclient.utils import InferenceServerException

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


class RawHttpInferClient:
    """Pre-built HTTP/1.1 inference requests on pooled keep-alive gevent sockets.

    Args:
        url: ``host:port`` (an ``http://`` prefix is accepted).
        inputs: the payloads; one request is built per payload, once.
        concurrency: connections at most (callers beyond it wait for a free one).
        timeout_s: connect and per-read timeout.
        requests: the requests already built for ``url`` and ``inputs``
            (:func:`raw_http_requests`; shared by the users of a process); None builds them.
        class_requests: with traffic classes, the requests of each class by class index
            (``PreparedRequests.by_class``); None: every request is ``requests``'.
        parts: a sequence model's payloads (:func:`http_parts`): each request is assembled
            from them with its sequence's and class's parameters (``requests`` unused).
        classes: the traffic classes (their parameters, with ``parts``).
    """

    #: Bytes read per ``recv`` call; one read holds a whole small response.
    BLOCK = 65536

    def __init__(
        self,
        url: str,
        inputs: InputSet,
        concurrency: int = 1,
        timeout_s: float = 60.0,
        requests: Sequence[bytes] | None = None,
        class_requests: Sequence[Sequence[bytes]] | None = None,
        parts: Sequence[HttpParts] | None = None,
        classes: Sequence[RequestClass] = (),
    ) -> None:
        self._address = _split_url(url)
        self._timeout_s = timeout_s
        self._slots = BoundedSemaphore(max(1, concurrency))
        self._idle: list[socket.socket] = []
        self._parts = parts
        self._class_kwargs = [c.infer_kwargs() for c in classes] or [{}]
        if parts is None:
            self._requests = requests if requests is not None else raw_http_requests(url, inputs)
        else:
            self._requests = []
            host, port = self._address
            self._head = (
                f"POST /v2/models/{inputs.model}/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "Connection: keep-alive\r\nContent-Type: application/octet-stream\r\n"
            )
        self._by_class = class_requests or (self._requests,)
        self._checked = False

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self._address, timeout=self._timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def infer(
        self, payload_index: int, klass: int = 0, sequence: SequenceStep | None = None
    ) -> None:
        """Send one request and read its response; ``InferError`` on a non-200 answer."""
        if self._parts is not None:
            request = self._assemble(payload_index, klass, sequence)
        else:
            requests = self._by_class[klass]
            request = requests[payload_index % len(requests)]
        status, headers, data = self.exchange(request)
        if status != 200:
            raise InferError(_error_kind(status, data))
        if not self._checked:
            _check_first(data, headers.get("inference-header-content-length"))
            self._checked = True

    def _assemble(self, payload_index: int, klass: int, sequence: SequenceStep | None) -> bytes:
        """A sequence model's request: the payload's tail behind a header built now."""
        assert self._parts is not None
        if sequence is None:
            raise ValueError("a sequence model's request needs its sequence step")
        parts = self._parts[payload_index % len(self._parts)]
        body, json_size = parts.body({**sequence.parameters(), **self._class_kwargs[klass]})
        # A JSON-only body (inputs in shared memory) has no header length, as tritonclient's.
        header_length = f"Inference-Header-Content-Length: {json_size}\r\n" if parts.tail else ""
        return (f"{self._head}{header_length}Content-Length: {len(body)}\r\n\r\n").encode(
            "latin-1"
        ) + body

    def exchange(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        """One request/response on a pooled connection: (status, the headers read, body).

        A kept-alive connection that the server closed while idle fails before any response
        byte arrives; then, and only then, the request goes once more on a new connection (it
        cannot have been processed: the server never answered it).
        """
        with self._slots:
            reused = bool(self._idle)
            sock = self._idle.pop() if reused else self._connect()
            try:
                first = self._send(sock, request, reused)
                if not first and reused:
                    sock.close()
                    sock = self._connect()
                    first = self._send(sock, request, False)
                if not first:
                    raise ResponseError("the server closed the connection without answering")
                status, headers, data, keep = self._read(sock, first)
            except BaseException:
                sock.close()
                raise
            if keep:
                self._idle.append(sock)
            else:
                sock.close()
            return status, headers, data

    def _send(self, sock: socket.socket, request: bytes, reused: bool) -> bytes:
        """Send, then the first response bytes (b"" when a reused connection was found dead)."""
        try:
            sock.sendall(request)
            return sock.recv(self.BLOCK)
        except ConnectionError:
            if reused:
                return b""
            raise

    def _read(self, sock: socket.socket, buf: bytes) -> tuple[int, dict[str, str], bytes, bool]:
        """Parse the response that starts with ``buf``: (status, headers, body, keep-alive)."""
        while (end := buf.find(b"\r\n\r\n")) < 0:
            if len(buf) > self.BLOCK * 4:
                raise ResponseError("response header longer than 256 KiB")
            buf += self._recv_more(sock, "inside the response header")
        head = buf[:end].decode("latin-1").split("\r\n")
        parts = head[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ResponseError(f"not an HTTP/1.x status line: {head[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name in _WANTED_HEADERS:
                headers[name] = value.strip()
        keep = parts[0] != "HTTP/1.0" and headers.get("connection", "").lower() != "close"
        body = buf[end + 4 :]
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, headers, self._read_chunked(sock, body), keep
        length = headers.get("content-length")
        if length is None:  # the body lasts until the server closes the connection
            chunks = [body]
            while more := sock.recv(self.BLOCK):
                chunks.append(more)
            return status, headers, b"".join(chunks), False
        want = int(length)
        if len(body) < want:
            chunks, have = [body], len(body)
            while have < want:
                more = self._recv_more(sock, "inside the response body", want - have)
                chunks.append(more)
                have += len(more)
            body = b"".join(chunks)
        return status, headers, body[:want], keep

    def _read_chunked(self, sock: socket.socket, buf: bytes) -> bytes:
        out: list[bytes] = []
        while True:
            while b"\r\n" not in buf:
                buf += self._recv_more(sock, "inside a chunked body")
            line, buf = buf.split(b"\r\n", 1)
            size = int(line.split(b";", 1)[0], 16)
            while len(buf) < size + 2:
                buf += self._recv_more(sock, "inside a chunked body")
            if size == 0:  # no trailers expected from an inference server
                return b"".join(out)
            out.append(buf[:size])
            buf = buf[size + 2 :]

    def _recv_more(self, sock: socket.socket, where: str, size: int = 0) -> bytes:
        more = sock.recv(max(self.BLOCK, size))
        if not more:
            raise ResponseError(f"the server closed the connection {where}")
        return more

    def close(self) -> None:
        """Close all pooled connections."""
        idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()


_WANTED_HEADERS = frozenset(
    ("content-length", "transfer-encoding", "connection", "inference-header-content-length")
)


class PooledHttpInferClient:
    """Pre-serialised KServe v2 HTTP requests over geventhttpclient's keep-alive pool."""

    def __init__(
        self,
        url: str,
        inputs: InputSet,
        concurrency: int = 1,
        timeout_s: float = 60.0,
        requests: Sequence[tuple[bytes, dict[str, str]]] | None = None,
        class_requests: Sequence[Sequence[tuple[bytes, dict[str, str]]]] | None = None,
        parts: Sequence[HttpParts] | None = None,
        classes: Sequence[RequestClass] = (),
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
        self._parts = parts
        self._class_kwargs = [c.infer_kwargs() for c in classes] or [{}]
        if parts is None:
            self._requests = requests if requests is not None else http_bodies(inputs)
        else:
            self._requests = []
        self._by_class = class_requests or (self._requests,)
        self._checked = False

    def infer(
        self, payload_index: int, klass: int = 0, sequence: SequenceStep | None = None
    ) -> None:
        """POST one request; raise ``InferError`` on a non-200 answer."""
        if self._parts is not None:
            if sequence is None:
                raise ValueError("a sequence model's request needs its sequence step")
            parts = self._parts[payload_index % len(self._parts)]
            body, json_size = parts.body({**sequence.parameters(), **self._class_kwargs[klass]})
            headers = {"Content-Type": "application/octet-stream"}
            if parts.tail:
                headers["Inference-Header-Content-Length"] = str(json_size)
        else:
            requests = self._by_class[klass]
            body, headers = requests[payload_index % len(requests)]
        with self._client.request("POST", self._path, body=body, headers=headers) as resp:
            data = resp.read()
            status = resp.status_code
            header_len = resp.get("inference-header-content-length")
        if status != 200:
            raise InferError(_error_kind(status, data))
        if not self._checked:
            _check_first(data, str(header_len) if header_len else None)
            self._checked = True

    def close(self) -> None:
        """Close all pooled connections."""
        self._client.close()


class GrpcInferClient:
    """tritonclient.grpc unary inference (needs gevent-initialised grpc)."""

    def __init__(
        self,
        url: str,
        inputs: InputSet,
        timeout_s: float = 60.0,
        requests: Sequence[tuple[list[Any], list[Any] | None]] | None = None,
        classes: Sequence[RequestClass] = (),
    ) -> None:
        self._client = grpcclient.InferenceServerClient(url)
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
                **(sequence.parameters() if sequence is not None else {}),
                **self._class_kwargs[klass],
            )
        except InferenceServerException as exc:
            raise InferError(f"gRPC {exc.status()}: {exc.message()}") from exc

    def close(self) -> None:
        """Close the channel."""
        _close_grpc(self._client)


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
    url: str, inputs: InputSet, klass: RequestClass | None = None, shm: Any = None
) -> list[bytes]:
    """Whole HTTP/1.1 requests (request line, headers, body) for ``url``, one per rotation slot,
    with ``klass``'s priority and timeout parameters (``shm``: inputs in shared memory)."""
    host, port = _split_url(url)
    head = (
        f"POST /v2/models/{inputs.model}/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Connection: keep-alive\r\n"
    )

    def build(index: int) -> bytes:
        body, headers = _request_body(inputs, index, klass, shm)
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return f"{head}{lines}Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body

    return _per_payload(inputs, build)


def http_bodies(
    inputs: InputSet, klass: RequestClass | None = None, shm: Any = None
) -> list[tuple[bytes, dict[str, str]]]:
    """Binary-extension bodies and their headers, one per rotation slot (with ``klass``'s
    parameters; ``shm``: JSON-only bodies naming the shared-memory region)."""
    return _per_payload(inputs, lambda index: _request_body(inputs, index, klass, shm))


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


def prepare_requests(
    protocol: str,
    url: str,
    inputs: InputSet,
    http_client: str = "raw",
    classes: Sequence[RequestClass] = (),
    sequence: bool = False,
    shm: Any = None,
) -> PreparedRequests:
    """The requests ``make_client`` would build for these arguments, built once per
    ``InputSet`` (kept in its ``request_cache``) and shared by every client made from it.

    ``sequence``: a sequence-batched model (every request carries its sequence parameters).
    ``shm``: an :class:`~analyzer.load.shm.ShmInputs` of ``inputs`` registered with the
    target over ``protocol``: requests name its region instead of carrying tensor data.
    """
    kind = "" if protocol == "grpc" else http_client
    classes = tuple(classes)
    key: tuple[Any, ...] = (protocol, kind, url, classes) if classes else (protocol, kind, url)
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
            return http_bodies(inputs, klass, shm)
        return raw_http_requests(url, inputs, klass, shm)

    by_class: tuple[tuple[Any, ...], ...] = ()
    if sequence and protocol != "grpc":  # the header is completed per request
        items = tuple(http_parts(inputs, shm))
    else:
        items = tuple(build(None))
        if classes and protocol != "grpc":  # gRPC sends the parameters per call
            by_class = tuple(items if not c.infer_kwargs() else tuple(build(c)) for c in classes)
    prepared = PreparedRequests(protocol, kind, url, items, classes, by_class, sequence)
    inputs.request_cache[key] = prepared
    return prepared


def make_client(
    protocol: str,
    url: str,
    inputs: InputSet,
    concurrency: int,
    http_client: str = "raw",
    prepared: PreparedRequests | None = None,
    classes: Sequence[RequestClass] = (),
    sequence: bool = False,
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
    """
    kind = "" if protocol == "grpc" else http_client
    classes = tuple(classes)
    if prepared is None or (
        prepared.protocol,
        prepared.http_client,
        prepared.url,
        prepared.classes,
        prepared.sequence,
    ) != (protocol, kind, url, classes, sequence):
        prepared = prepare_requests(protocol, url, inputs, http_client, classes, sequence)
    shared = prepared.items
    if protocol == "grpc":
        return GrpcInferClient(url, inputs, requests=shared, classes=classes)
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
    )


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
    from analyzer.target.server_stats import http_stats_source

    return http_stats_source(url, model)
