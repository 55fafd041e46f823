"""The HTTP seam of the analyzer: one small protocol, two real implementations, a mock.

After httpx's ``BaseTransport`` / ``MockTransport``: every HTTP call of the analyzer outside the
load generator (the targets of ``analyzer.target.managed``, the statistics and metrics scrapes of
``analyzer.target.server_stats``, the probe's bursts in ``analyzer.predict.probe``) builds a
:class:`Request` and hands it to a :class:`Transport`. :class:`UrllibTransport` sends it on a new
connection; :class:`KeepAliveTransport` keeps one connection per thread and host, for many small
requests in a row from a thread pool; :class:`MockTransport` answers it with a function, so
that what a caller makes of refused connections, timeouts, 4xx/5xx replies and models that
never get ready is tested without a server (``tests/unit/test_transport.py``).

A transport that gets no answer raises :class:`OSError` (``ConnectionRefusedError``,
``TimeoutError``, ``urllib.error.URLError``...), exactly as urllib does; any answer, whatever
its status, is a :class:`Response` (:meth:`Response.raise_for_status` turns a non-2xx one into
an :class:`HTTPStatusError`, an ``OSError`` too). Only the standard library's HTTP is used, so
no gevent or tritonclient import is needed, and it works in a gevent-patched process as well.

Both real transports take a :class:`~analyzer.config.access.ServerAccess`: its headers go with
every request, and ``https://`` URLs are sent over TLS with its files.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from analyzer.config.access import PLAIN, ServerAccess


@dataclass(frozen=True)
class Request:
    """One HTTP request.

    Attributes:
        method: ``GET`` or ``POST``.
        url: The full URL (``http://host:port/path``).
        body: A JSON-serialisable body (sent as ``application/json``), or None.
        timeout_s: How long to wait for the answer.
        content: A raw body, sent as it is (instead of ``body``; give its ``Content-Type``
            in ``headers``).
        headers: Extra request headers.
    """

    method: str
    url: str
    body: Any = None
    timeout_s: float = 30.0
    content: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def encoded(self) -> tuple[bytes | None, dict[str, str]]:
        """The bytes to send and the headers to send them with."""
        headers = dict(self.headers)
        if self.content is not None:
            return self.content, headers
        if self.body is None:
            return None, headers
        headers.setdefault("Content-Type", "application/json")
        return json.dumps(self.body).encode(), headers


class HTTPStatusError(OSError):
    """An answer whose status is not 2xx, where only a success will do
    (:meth:`Response.raise_for_status`).

    Attributes:
        status: The HTTP status code.
        url: The URL that answered it.
    """

    def __init__(self, status: int, url: str, reason: str = "") -> None:
        super().__init__(f"HTTP Error {status}: {reason}" if reason else f"HTTP Error {status}")
        self.status = status
        self.url = url


@dataclass(frozen=True)
class Response:
    """An HTTP answer, whatever its status.

    Attributes:
        status: The HTTP status code.
        content: The raw body.
    """

    status: int
    content: bytes = b""

    @classmethod
    def of_json(cls, status: int, payload: Any) -> Response:
        """A response whose body is ``payload`` as JSON (for mocks)."""
        return cls(status, json.dumps(payload).encode())

    def text(self) -> str:
        """The body decoded as UTF-8 (undecodable bytes replaced)."""
        return self.content.decode("utf-8", errors="replace")

    def raise_for_status(self, url: str = "") -> Response:
        """This response when its status is 2xx.

        Raises:
            HTTPStatusError: Any other status (the body's first line is its reason).
        """
        if 200 <= self.status < 300:
            return self
        reason = self.text().strip().splitlines()[0][:200] if self.content.strip() else ""
        raise HTTPStatusError(self.status, url, reason)

    def payload(self) -> Any:
        """The body as decoded JSON; as text when it is not JSON; None when empty."""
        if not self.content:
            return None
        try:
            return json.loads(self.content)
        except ValueError:
            return self.text()


class Transport(Protocol):
    """Sends a request; raises :class:`OSError` when no answer came."""

    def request(self, request: Request) -> Response:
        """Send ``request`` and return the answer (any status)."""
        ...


class _Secured:
    """The headers and the TLS context (made once, on the first ``https://`` request) of an
    access."""

    def __init__(self, access: ServerAccess) -> None:
        self.access = access
        self._context: ssl.SSLContext | None = None

    def headers(self, request: Request) -> tuple[bytes | None, dict[str, str]]:
        data, headers = request.encoded()
        return data, {**self.access.http_headers(), **headers}

    def context(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = self.access.ssl_context()
        return self._context


class UrllibTransport(_Secured):
    """The real transport: :mod:`urllib.request`, one connection per request.

    Args:
        access: TLS files and headers (default: none).
    """

    def __init__(self, access: ServerAccess = PLAIN) -> None:
        super().__init__(access)

    def request(self, request: Request) -> Response:
        data, headers = self.headers(request)
        raw = urllib.request.Request(request.url, data=data, headers=headers, method=request.method)
        tls = self.context() if request.url.lower().startswith("https:") else None
        try:
            with urllib.request.urlopen(raw, timeout=request.timeout_s, context=tls) as response:
                return Response(response.status, response.read())
        except urllib.error.HTTPError as exc:  # an answer, only not a 2xx one
            return Response(exc.code, exc.read())


Connect = Callable[[str, int, float, "ssl.SSLContext | None"], http.client.HTTPConnection]


def _connect(
    host: str, port: int, timeout_s: float, tls: ssl.SSLContext | None
) -> http.client.HTTPConnection:
    if tls is not None:
        return http.client.HTTPSConnection(host, port, timeout=timeout_s, context=tls)
    return http.client.HTTPConnection(host, port, timeout=timeout_s)


class KeepAliveTransport(_Secured):
    """The real transport for many requests in a row: :mod:`http.client`, one keep-alive
    connection per thread and host (a thread pool sends concurrent requests without a new
    connection for each). A connection that fails is closed and the next request of that thread
    opens a new one; :meth:`close` closes them all.

    Args:
        connect: Opens a connection to ``(host, port, timeout_s, tls context or None)``
            (default :class:`http.client.HTTPConnection` or ``HTTPSConnection``; tests pass a
            fake one).
        access: TLS files and headers (default: none).
    """

    def __init__(self, connect: Connect = _connect, access: ServerAccess = PLAIN) -> None:
        super().__init__(access)
        self._connect = connect
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(self, request: Request) -> Response:
        parts = urlsplit(request.url)
        secure = parts.scheme.lower() == "https"
        address = (parts.hostname or "127.0.0.1", parts.port or (443 if secure else 80))
        mine: dict[tuple[str, int], http.client.HTTPConnection] | None = getattr(
            self._local, "connections", None
        )
        if mine is None:
            mine = self._local.connections = {}
        conn = mine.get(address)
        if conn is None:
            tls = self.context() if secure else None
            conn = mine[address] = self._connect(*address, request.timeout_s, tls)
            with self._lock:
                self._connections.append(conn)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        data, headers = self.headers(request)
        try:
            conn.request(request.method, path, data, headers)
            reply = conn.getresponse()
            content = reply.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            del mine[address]
            if isinstance(exc, OSError):
                raise
            raise ConnectionError(str(exc) or type(exc).__name__) from exc  # no usable answer
        return Response(reply.status, content)

    def close(self) -> None:
        """Close every connection opened so far."""
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()


class MockTransport:
    """A transport that answers with ``handler`` (it may raise :class:`OSError` to act out a
    server that is down or does not answer in time).

    Attributes:
        requests: Every request seen, in order.
    """

    def __init__(self, handler: Callable[[Request], Response]) -> None:
        self.handler = handler
        self.requests: list[Request] = []

    def request(self, request: Request) -> Response:
        self.requests.append(request)
        return self.handler(request)


def http_json(
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    timeout_s: float = 30.0,
    transport: Transport | None = None,
) -> tuple[int, Any]:
    """One HTTP request with a JSON body; returns (status, decoded JSON or text)."""
    answer = (transport or UrllibTransport()).request(Request(method, url, body, timeout_s))
    return answer.status, answer.payload()
