"""Errors of the reference server.

Every failure the server reports carries a Triton status code, so each frontend can map it to
the HTTP status and gRPC code that Triton would use::

    ServerError            root; ``code`` is a :class:`Code`
    ├── ModelConfigError   an invalid config.pbtxt or config override (INVALID_ARG)
    ├── BackendError       a backend failed to load or to execute (INTERNAL unless stated)
    └── DecoupledRefusal   a decoupled model asked for one response (UNSUPPORTED; each
                           frontend words it as Triton does)
"""

from __future__ import annotations

import enum


class Code(enum.Enum):
    """Triton's error codes (``TRITONSERVER_Error_Code``)."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"

    @property
    def http_status(self) -> int:
        """The HTTP status Triton (>= 24.01) answers with for this code."""
        return _HTTP_STATUS[self]


_HTTP_STATUS = {
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.INVALID_ARG: 400,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
    Code.UNKNOWN: 400,
}


class ServerError(Exception):
    """A failure reported to a client, with Triton's code and message."""

    def __init__(self, message: str, code: Code = Code.INVALID_ARG) -> None:
        super().__init__(message)
        self.code = code

    @property
    def message(self) -> str:
        return str(self)


class ModelConfigError(ServerError):
    """A model configuration that Triton would refuse to load."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Code.INVALID_ARG)


class BackendError(ServerError):
    """A backend that failed to load a model or to execute a batch."""

    def __init__(self, message: str, code: Code = Code.INTERNAL) -> None:
        super().__init__(message, code)


class DecoupledRefusal(ServerError):
    """A decoupled model asked for a single response (each frontend words it as Triton does)."""

    def __init__(self, model: str) -> None:
        super().__init__(
            f"model '{model}' is decoupled: it answers through a stream", Code.UNSUPPORTED
        )
