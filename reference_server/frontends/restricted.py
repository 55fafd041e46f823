"""Restricted APIs: ``--http-restricted-api`` and ``--grpc-restricted-protocol``, as Triton 2.51.

Each flag value is ``<group>[,<group>...]:<key>=<value>``: a request to an API of a listed group
is refused unless it carries the header ``<key>: <value>``. The groups are Triton's
(:data:`GROUPS`); a group may appear in one value only. For gRPC the header Triton checks is the
metadata key ``triton-grpc-protocol-<key>`` (:data:`GRPC_HEADER_PREFIX`), and the refusal names
that full key.

Refusals, checked before anything else about the request (method, model, body):

- HTTP: status 403, ``{"error": "This API is restricted, expecting header '<key>'"}``. The
  header name matches case-insensitively, the value exactly; of repeated headers the first
  counts.
- gRPC: status ``UNAVAILABLE``, details ``This protocol is restricted, expecting header
  'triton-grpc-protocol-<key>'``; a stream is ended with it before any message is read.

``/metrics`` (its own port) is never restricted, as in Triton. Which HTTP path belongs to which
group follows Triton's request dispatch (:func:`http_group`), including paths this server
answers 404 (``/v2/trace/setting``, ``/v2/logging``, ``generate``): a restricted group refuses
them first. One known difference: Triton keeps trailing whitespace in an HTTP header value
(``secret `` does not match ``secret``); aiohttp strips it, as HTTP says, so it matches here.
This module is pure: parsing and lookups, no sockets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from reference_server.core.errors import Code, ServerError

#: Triton's group names, in its order (``RESTRICTED_CATEGORY_NAMES``).
GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)

#: What Triton puts in front of a ``--grpc-restricted-protocol`` key to name the metadata key.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

#: The group of each gRPC method (full method names as grpc dispatches them).
GRPC_METHOD_GROUPS: Mapping[str, str] = {
    **{
        f"/inference.GRPCInferenceService/{method}": group
        for group, methods in (
            ("health", ("ServerLive", "ServerReady", "ModelReady")),
            ("metadata", ("ServerMetadata", "ModelMetadata")),
            ("inference", ("ModelInfer", "ModelStreamInfer")),
            ("model-config", ("ModelConfig",)),
            ("statistics", ("ModelStatistics",)),
            ("trace", ("TraceSetting",)),
            ("logging", ("LogSettings",)),
            (
                "shared-memory",
                (
                    "SystemSharedMemoryStatus",
                    "SystemSharedMemoryRegister",
                    "SystemSharedMemoryUnregister",
                    "CudaSharedMemoryStatus",
                    "CudaSharedMemoryRegister",
                    "CudaSharedMemoryUnregister",
                ),
            ),
            (
                "model-repository",
                ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"),
            ),
        )
        for method in methods
    },
    # Triton serves grpc.health.v1 Check (not Watch) and restricts it with the health group.
    "/grpc.health.v1.Health/Check": "health",
}

# Triton's HTTP dispatch (http_server.cc), the same expressions, tried in the same order.
_MODEL = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
    r"(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?"
)
_SERVER = re.compile(r"/v2(?:/health/(live|ready))?")
_SHARED_MEMORY = re.compile(
    r"/v2/(?:system|cuda)sharedmemory(?:/region/([^/]+))?/(status|register|unregister)"
)
_REPOSITORY = re.compile(r"/v2/repository(?:/([^/]+))?/(index|models/([^/]+)/(load|unload))")
_MODEL_ACTION_GROUPS = {
    "": "metadata",
    "ready": "health",
    "infer": "inference",
    "generate": "inference",
    "generate_stream": "inference",
    "config": "model-config",
    "stats": "statistics",
}


@dataclass(frozen=True)
class Restriction:
    """The header a restricted group needs: its exact name as configured and its value."""

    header: str
    value: str


@dataclass(frozen=True)
class Restrictions:
    """Which groups are restricted, and by which header (empty: nothing is restricted).

    Attributes:
        by_group: group name -> the header it needs.
    """

    by_group: Mapping[str, Restriction] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.by_group)

    def get(self, group: str | None) -> Restriction | None:
        """The restriction of ``group`` (``None`` when it is free or there is no group)."""
        return self.by_group.get(group) if group is not None else None


def parse_restrictions(
    values: Iterable[str], *, option: str, header_prefix: str = ""
) -> Restrictions:
    """Parse the values of one flag, rejecting what ``tritonserver`` rejects, with its message.

    Args:
        values: Every ``<group>[,<group>...]:<key>=<value>`` given for the flag.
        option: ``http-restricted-api`` or ``grpc-restricted-protocol`` (named in messages).
        header_prefix: Put in front of each key (:data:`GRPC_HEADER_PREFIX` for gRPC).

    Raises:
        ServerError: INVALID_ARG: not ``<groups>:<key>=<value>`` with all three parts non-empty,
            an unknown group (names are case-sensitive), or a group in two values.
    """
    feature = "protocol" if option.startswith("grpc") else "api"
    by_group: dict[str, Restriction] = {}
    for text in values:
        groups, key, value = _split(text, option)
        for group in groups.split(","):
            if group not in GROUPS:
                raise ServerError(
                    f"unknown restricted {feature} '{group}' in --{option}={text}: use "
                    f"{', '.join(GROUPS)}",
                    Code.INVALID_ARG,
                )
            if group in by_group:
                raise ServerError(
                    f"restricted {feature} '{group}' can not be specified in multiple config "
                    "groups",
                    Code.INVALID_ARG,
                )
            by_group[group] = Restriction(header_prefix + key, value)
    return Restrictions(by_group)


def _split(text: str, option: str) -> tuple[str, str, str]:
    """``(groups, key, value)``: split at the first ``:`` and the first ``=`` after it."""
    groups, colon, setting = text.partition(":")
    key, equals, value = setting.partition("=")
    if not (colon and equals and groups and key and value):
        raise ServerError(
            f"--{option} option format is '<config name>:<setting>=<value>'. Got {text}",
            Code.INVALID_ARG,
        )
    return groups, key, value


def http_group(path: str) -> str | None:
    """The group of an HTTP request path (no query string); ``None``: not a Triton API path."""
    if path == "/v2/models/stats":
        return "statistics"
    if path == "/v2/logging":
        return "logging"
    model = _MODEL.fullmatch(path)
    if model is not None:
        version, action = model.group(2), model.group(3) or ""
        if action == "trace/setting":
            # Triton has no per-version trace settings: that path is not found.
            if not version:
                return "trace"
        else:
            return _MODEL_ACTION_GROUPS[action]
    if path == "/v2":
        return "metadata"
    if _SERVER.fullmatch(path):
        return "health"
    if _SHARED_MEMORY.fullmatch(path):
        return "shared-memory"
    if _REPOSITORY.fullmatch(path):
        return "model-repository"
    if path == "/v2/trace/setting":
        return "trace"
    return None


def http_refusal(restriction: Restriction) -> str:
    """Triton's HTTP error message (status 403) for a request without the header."""
    return f"This API is restricted, expecting header '{restriction.header}'"


def grpc_refusal(restriction: Restriction) -> str:
    """Triton's gRPC details (status UNAVAILABLE) for a call without the metadata key."""
    return f"This protocol is restricted, expecting header '{restriction.header}'"


def http_allows(restriction: Restriction, headers: Mapping[str, str]) -> bool:
    """Whether HTTP ``headers`` (a case-insensitive mapping, first value wins) carry it."""
    return headers.get(restriction.header) == restriction.value


def grpc_allows(restriction: Restriction, metadata: Iterable[tuple[str, str | bytes]]) -> bool:
    """Whether gRPC invocation metadata carries it (the first entry of the key counts)."""
    for key, value in metadata:
        if key == restriction.header:
            return value == restriction.value
    return False


__all__ = [
    "GROUPS",
    "GRPC_HEADER_PREFIX",
    "GRPC_METHOD_GROUPS",
    "Restriction",
    "Restrictions",
    "grpc_allows",
    "grpc_refusal",
    "http_allows",
    "http_group",
    "http_refusal",
    "parse_restrictions",
]
