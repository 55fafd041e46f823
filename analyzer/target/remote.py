"""A server that is already running at ``--url`` (a real Triton or a reference server).

:class:`RemoteTarget` is never restarted: when it dies, the sweep waits for it to come back
(:func:`analyzer.target.liveness.wait_for_return`). ``https://`` URLs are spoken over TLS, and
every request carries the access's headers (:mod:`analyzer.config.access`). Before any trial,
:meth:`RemoteTarget.start` calls each API a sweep needs once, so a restricted API or a proxy
that refuses the token stops the run there with :class:`~analyzer.errors.AccessDeniedError`.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from typing import Any

from analyzer.config.access import PLAIN, ServerAccess, access_denied
from analyzer.config.urls import http_url
from analyzer.errors import TargetDiedError, TargetError
from analyzer.target.liveness import wait_for_return
from analyzer.target.protocol import _HttpTarget
from analyzer.target.transport import Transport, UrllibTransport


class RemoteTarget(_HttpTarget):
    """A running server at ``url`` (real Triton in explicit model-control mode, or ours).

    Args:
        url: The server's HTTP address (``http://`` added when missing; ``https://``: TLS).
        model: The model to tune.
        timeout_s: How long :meth:`start` waits for the server to answer ready.
        wait_s: How long :meth:`ensure_alive` waits for a server that stopped answering to
            return (a restarted pod) before the run stops (``run.server_wait_s``).
        transport: The HTTP seam (default: urllib with ``access``).
        access: TLS files and headers of every request.
        clock: Monotonic seconds (default :func:`time.monotonic`).
        sleep: Waits between polls (default :func:`time.sleep`).

    Attributes:
        outages: Each time the server stopped answering: when, how long it was waited for,
            and whether it returned (the summary's ``environment.target.outages``).
    """

    shared = True

    def __init__(
        self,
        url: str,
        model: str,
        timeout_s: float = 10.0,
        transport: Transport | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
        wait_s: float = 60.0,
        access: ServerAccess = PLAIN,
    ) -> None:
        self.url = http_url(url)
        self.access = access
        self.model = model
        self.device = "remote"
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self.outages: list[dict[str, Any]] = []
        #: ``GET /v2`` as read at start (and after an outage): describing a server that has
        #: died since must not wait on it.
        self._metadata: dict[str, Any] = {}
        self.transport = transport or UrllibTransport(access)
        if clock is not None:
            self.clock = clock
        if sleep is not None:
            self.sleep = sleep

    def start(self) -> None:
        """Check that the server answers and the model is ready."""
        deadline = self.clock() + self.timeout_s
        last = "no answer"
        while self.clock() < deadline:
            try:
                status, payload = self._get("/v2/health/ready", timeout_s=2.0)
                if status == 200:
                    break
                if status in _REFUSED:
                    raise access_denied("health", _said(status, payload), self.access)
                last = f"HTTP {status}"
            except OSError as exc:
                if _is_tls_failure(exc):
                    raise access_denied("health", f"TLS: {_reason(exc)}", self.access) from exc
                last = _reason(exc)
            self.sleep(0.2)
        else:
            raise TargetError(f"cannot reach the server at {self.url} ({last}); check --url")
        if not self._is_ready():
            raise TargetError(
                f"model {self.model!r} is not ready on {self.url}; load it first "
                "(the server must run with --model-control-mode=explicit for perfsweep to reload it)"
            )
        if self.access.ssl_insecure:
            self.notify(f"--ssl-insecure: the certificate of {self.url} is not verified")
        self._check_access()
        self._metadata = self.server_metadata()

    def _check_access(self) -> None:
        """Call each API a sweep uses once (reading only): one the server refuses (Triton's
        ``--http-restricted-api`` without its header, a proxy's token check) stops the run
        before any trial, naming the API and the flag that gives the credentials."""
        for api, method, path, body in (
            ("metadata", "GET", "/v2", None),
            ("model-config", "GET", f"/v2/models/{self.model}/config", None),
            ("statistics", "GET", f"/v2/models/{self.model}/stats", None),
            ("model-repository", "POST", "/v2/repository/index", {}),
        ):
            try:
                status, payload = self._call(method, path, body)
            except OSError as exc:
                raise TargetError(f"{self.url}{path}: {_reason(exc)}") from exc
            if status in _REFUSED:
                raise access_denied(api, f"{method} {path}: {_said(status, payload)}", self.access)

    def stop(self) -> None:
        """Nothing to stop: the server belongs to someone else."""

    def ensure_alive(self) -> None:
        """Return when the server answers. One that stopped answering cannot be restarted from
        here: it is waited for up to :attr:`wait_s` (a Kubernetes restart), the outage
        recorded, and the last config loaded again (a restarted server lost it).

        Raises:
            TargetDiedError: It did not return within :attr:`wait_s`.
        """
        if self._is_live():
            return
        started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        waited = wait_for_return(
            self.url,
            self.wait_s,
            self.notify,
            transport=self.transport,
            clock=self.clock,
            sleep=self.sleep,
        )
        outage = {"started_at": started_at, "returned": waited is not None}
        outage["waited_s"] = round(self.wait_s if waited is None else waited, 1)
        self.outages.append(outage)
        if waited is None:
            raise TargetDiedError(
                f"the server at {self.url} stopped answering and did not return within "
                f"{self.wait_s:g} s (run.server_wait_s, --server-wait-s)",
                self.url,
            )
        self._metadata = self.server_metadata()
        self.reload_last()

    def describe(self) -> dict[str, Any]:
        meta = self._metadata or self.server_metadata()
        return {
            "kind": "remote",
            "url": self.url,
            "device": self.device,
            "server": meta.get("name"),
            "server_version": meta.get("version"),
            "outages": list(self.outages),
            "access": self.access.describe(),
        }


#: Statuses of a refusal for want of credentials (Triton's restricted APIs answer 403).
_REFUSED = (401, 403)


def _said(status: int, payload: Any) -> str:
    said = payload.get("error", payload) if isinstance(payload, dict) else payload
    lines = str(said or "").strip().splitlines()
    return f"HTTP {status}" + (f": {lines[0][:200]}" if lines else "")


def _reason(exc: OSError) -> str:
    return str(getattr(exc, "reason", exc))


def _is_tls_failure(exc: OSError) -> bool:
    """A TLS handshake that failed: a certificate the client or the server does not accept."""
    return isinstance(exc, ssl.SSLError) or isinstance(getattr(exc, "reason", None), ssl.SSLError)
