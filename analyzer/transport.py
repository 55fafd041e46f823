"""The HTTP seam in front of a target: one small protocol, a urllib implementation, a mock.

After httpx's ``BaseTransport`` / ``MockTransport``: the targets (``analyzer.target``) build a
:class:`Request` and hand it to a :class:`Transport`; :class:`UrllibTransport` sends it, and
:class:`MockTransport` answers it with a function, so that what a target makes of refused
connections, timeouts, 4xx/5xx replies and models that never get ready is tested without a
server (``tests/unit/test_transport.py``).

A transport that gets no answer raises :class:`OSError` (``ConnectionRefusedError``,
``TimeoutError``, ``urllib.error.URLError``...), exactly as urllib does; any answer, whatever
its status, is a :class:`Response`. Only plain HTTP (urllib) is used, so no gevent or
tritonclient import is needed to manage a target.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Request:
    """One HTTP request.

    Attributes:
        method: ``GET`` or ``POST``.
        url: The full URL (``http://host:port/path``).
        body: A JSON-serialisable body (sent as ``application/json``), or None.
        timeout_s: How long to wait for the answer.
    """

    method: str
    url: str
    body: Any = None
    timeout_s: float = 30.0


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


class UrllibTransport:
    """The real transport: :mod:`urllib.request`, one connection per request."""

    def request(self, request: Request) -> Response:
        data = json.dumps(request.body).encode() if request.body is not None else None
        raw = urllib.request.Request(request.url, data=data, method=request.method)
        if data is not None:
            raw.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(raw, timeout=request.timeout_s) as response:
                return Response(response.status, response.read())
        except urllib.error.HTTPError as exc:  # an answer, only not a 2xx one
            return Response(exc.code, exc.read())


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
