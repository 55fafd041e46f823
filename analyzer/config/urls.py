"""Server URLs as perfsweep accepts them: the one place a URL from a user enters.

``http://`` and ``https://`` (TLS with :mod:`analyzer.config.access`'s files) are accepted, a
bare ``host:port`` is taken as ``http://``. The scenario checks ``model.url`` with it when it is
loaded, and the targets and the load commands normalise every URL they are given.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from analyzer.errors import InputError


def http_url(url: str) -> str:
    """``url`` as ``http://host:port`` or ``https://host:port`` (a bare ``host:port`` gets
    ``http://``; no trailing /).

    Raises:
        InputError: another scheme.
    """
    text = url.strip().rstrip("/")
    scheme, sep, rest = text.partition("://")
    if not sep:
        return f"http://{text}"
    if scheme.lower() not in ("http", "https"):
        raise InputError(f"{url!r}: the URL must start with http:// or https://")
    return f"{scheme.lower()}://{rest}"


def is_tls(url: str) -> bool:
    """Whether ``url`` is an ``https://`` one."""
    return url.strip().lower().startswith("https://")


def host_port(url: str) -> str:
    """``host:port`` of ``url`` (its scheme and trailing / dropped)."""
    return url.strip().rstrip("/").split("://", 1)[-1]


def metrics_url_of(url: str) -> str:
    """Where the server at HTTP address ``url`` serves its Prometheus metrics by Triton's port
    layout: the same host, the HTTP port + 2, ``/metrics`` (``http://h:8000`` ->
    ``http://h:8002/metrics``; Triton's metrics port speaks plain HTTP). Without a port in
    ``url``: ``<url>/metrics``.

    Every command not told ``--metrics-url`` tries this address and goes on without the
    server's GPU figures where it does not answer.
    """
    base = url.strip().rstrip("/")
    parts = urlsplit(base if "://" in base else f"http://{base}")
    try:
        port = parts.port
    except ValueError:  # not a number: the URL's problem shows where it is used
        port = None
    if port is None or not parts.hostname:
        return f"{http_url(base)}/metrics"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"http://{host}:{port + 2}/metrics"
