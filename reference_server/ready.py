"""The one line the server prints once it listens, and the one parser for it.

``python -m reference_server`` prints ``ServerAddresses.ready_line()`` on stdout when HTTP,
gRPC and metrics all accept connections; anyone who starts the server as a subprocess (the
sweep's managed target, the dashboard launcher, tests) reads the bound ports back with
:func:`parse_ready_line` or :func:`last_ready` instead of a regex of their own::

    perfsweep reference server ready: http=127.0.0.1:8000 grpc=127.0.0.1:8001 metrics=127.0.0.1:8002

A server whose gRPC port speaks TLS says so at the end of the line, ``grpc-tls=tls`` or
``grpc-tls=mutual`` (client certificates required); nothing else about TLS (no file names).

This module imports nothing heavy, so a client can use it without loading the server.
"""

from __future__ import annotations

from dataclasses import dataclass

#: How the ready line starts.
READY_PREFIX = "perfsweep reference server ready:"
#: ``ServerAddresses.grpc_tls``: plain text, TLS, TLS with client certificates.
GRPC_TLS_MODES = ("", "tls", "mutual")


@dataclass(frozen=True)
class ServerAddresses:
    """Where a started server listens (ports as bound, never 0).

    ``grpc_tls`` is ``""`` for plain-text gRPC, ``"tls"`` or ``"mutual"`` (client certificates
    required) for TLS.
    """

    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    grpc_tls: str = ""

    @property
    def http_url(self) -> str:
        """``host:port`` as ``tritonclient.http`` expects it (no scheme)."""
        return f"{_url_host(self.host)}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` for ``tritonclient.grpc``."""
        return f"{_url_host(self.host)}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """The full URL of the Prometheus endpoint."""
        return f"http://{_url_host(self.host)}:{self.metrics_port}/metrics"

    def ready_line(self) -> str:
        """The one line printed at startup, e.g. ``... http=127.0.0.1:8000 grpc=... metrics=...``."""
        line = (
            f"{READY_PREFIX} http={self.http_url} grpc={self.grpc_url} "
            f"metrics={_url_host(self.host)}:{self.metrics_port}"
        )
        return f"{line} grpc-tls={self.grpc_tls}" if self.grpc_tls else line


def parse_ready_line(line: str) -> ServerAddresses | None:
    """Read a :meth:`ServerAddresses.ready_line` back (``None`` if ``line`` is another line)."""
    line = line.strip()
    if not line.startswith(READY_PREFIX):
        return None
    try:
        fields = dict(item.split("=", 1) for item in line[len(READY_PREFIX) :].split())
        hosts_ports = {key: value.rsplit(":", 1) for key, value in fields.items()}
        grpc_tls = fields.get("grpc-tls", "")
        if grpc_tls not in GRPC_TLS_MODES:
            return None  # cut inside the last field
        return ServerAddresses(
            host=hosts_ports["http"][0].strip("[]"),
            http_port=int(hosts_ports["http"][1]),
            grpc_port=int(hosts_ports["grpc"][1]),
            metrics_port=int(hosts_ports["metrics"][1]),
            grpc_tls=grpc_tls,
        )
    except (KeyError, IndexError, ValueError):
        return None  # a truncated line (the process is still writing it) or a foreign one


def last_ready(text: str) -> ServerAddresses | None:
    """The addresses of the last complete ready line in ``text`` (a log that may hold restarts)."""
    found = None
    for line in text.splitlines():
        found = parse_ready_line(line) or found
    return found


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


__all__ = ["GRPC_TLS_MODES", "READY_PREFIX", "ServerAddresses", "last_ready", "parse_ready_line"]
