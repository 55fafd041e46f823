"""The HTTP inference clients of the hot path (binary tensors).

:class:`RawHttpInferClient` (the default): one ``sendall`` of a prepared request on a pooled
keep-alive gevent socket and a minimal read of the response; :class:`PooledHttpInferClient`:
geventhttpclient's pool (``--http-client geventhttpclient``, for A/B comparisons).
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
import socket
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from gevent.lock import BoundedSemaphore
from geventhttpclient import HTTPClient

from analyzer.load.classes import RequestClass
from analyzer.load.inputs import InputSet
from analyzer.load.prepared import (
    HttpParts,
    InferError,
    ResponseError,
    _check_first,
    _error_kind,
    _split_url,
    http_bodies,
    raw_http_head,
    raw_http_requests,
)
from analyzer.load.sequences import SequenceStep


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
        tls: a client TLS context: every connection is wrapped in it (an ``https://`` target).
        headers: the access's headers (in ``requests`` already; added to ``parts``' requests).
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
        tls: ssl.SSLContext | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._address = _split_url(url)
        self._tls = tls
        self._timeout_s = timeout_s
        self._slots = BoundedSemaphore(max(1, concurrency))
        self._idle: list[socket.socket] = []
        self._parts = parts
        self._class_kwargs = [c.infer_kwargs() for c in classes] or [{}]
        if parts is None:
            if requests is None:
                requests = raw_http_requests(url, inputs, headers=headers)
            self._requests = requests
        else:
            self._requests = []
            self._head = (
                raw_http_head(url, inputs.model, headers)
                + "Content-Type: application/octet-stream\r\n"
            )
        self._by_class = class_requests or (self._requests,)
        self._checked = False

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self._address, timeout=self._timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            return self._tls.wrap_socket(sock, server_hostname=self._address[0])
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
        tls: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        host, port = _split_url(url)
        self._client = HTTPClient(
            host,
            port,
            concurrency=concurrency,
            connection_timeout=timeout_s,
            network_timeout=timeout_s,
            **(tls or {}),
        )
        self._headers = dict(headers or {})
        self._path = f"/v2/models/{inputs.model}/infer"
        self._parts = parts
        self._class_kwargs = [c.infer_kwargs() for c in classes] or [{}]
        if parts is None:
            self._requests = (
                requests if requests is not None else http_bodies(inputs, headers=headers)
            )
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
            headers = {**self._headers, "Content-Type": "application/octet-stream"}
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
