"""The dashboard's Triton users: the measurement engine's users, configured from Locust itself.

The engine's ``ClosedLoopUser`` and ``OpenLoopUser`` get their ``EngineConfig`` from perfsweep's
controller. Here there is no controller: the target comes from Locust's host field and perfsweep's
custom arguments (``options.py``), so the same classes work under ``perfsweep ui`` and a plain
``locust -f``. Each subclass only replaces ``on_start`` (where the context comes from); the task
loops, hence the timing rules (open loop timed from the intended send), are the engine's.

Every user of a process records into one shared ``Recorder`` (``LiveState.recorder``); the
dashboard collects it once a second.
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch before anything touches sockets
import logging
from dataclasses import replace
from typing import Any, ClassVar

from gevent.lock import Semaphore
from locust.env import Environment

from analyzer.config.urls import is_tls
from analyzer.errors import InputError, TargetError
from analyzer.load.context import EngineConfig, ProcessContext
from analyzer.load.recorder import Recorder
from analyzer.load.streams import STREAM_PROTOCOLS
from analyzer.load.users import ClosedLoopUser, OpenLoopUser
from analyzer.load.web.options import TargetSettings, access_from_env
from analyzer.measure.arrivals import parse_arrival
from analyzer.measure.specs import LoadMode
from analyzer.target.transport import UrllibTransport, http_json

log = logging.getLogger(__name__)

_STATE_ATTR = "perfsweep_live_state"


class LiveState:
    """Per-process state of the dashboard's users: settings, shared recorder, one context per protocol."""

    def __init__(self, environment: Environment) -> None:
        self.environment = environment
        self.recorder = Recorder()
        self._contexts: dict[str, tuple[tuple[Any, ...], ProcessContext]] = {}
        self._lock = Semaphore()
        self._discovered: dict[str, str] = {}

    def settings(self) -> TargetSettings:
        """The target as Locust's host field and perfsweep's options say now."""
        env = self.environment
        return TargetSettings.from_locust(env.host, env.parsed_options)

    def model(self, settings: TargetSettings) -> str:
        """The model name: the option, or the first READY model of the server's repository."""
        if settings.model:
            return settings.model
        if settings.http_url not in self._discovered:
            self._discovered[settings.http_url] = discover_model(settings.http_url)
        return self._discovered[settings.http_url]

    def known_model(self, settings: TargetSettings) -> str:
        """The model name if known without asking the server ("" otherwise)."""
        return settings.model or self._discovered.get(settings.http_url, "")

    def context(self, protocol: str) -> ProcessContext:
        """A configured engine context for ``protocol`` whose recorder is the shared one.

        ``protocol`` is ``http`` or ``grpc`` (requests answered once), or ``stream``: a
        generative model's token streams over the form's ``--stream-protocol``, with its
        ``--input-tokens`` / ``--output-tokens``. Built once per (protocol, target, model,
        request settings); rebuilt when the form changes them.
        """
        with self._lock:  # the first users start together; fetch the model documents once
            settings = self.settings()
            model = self.model(settings)
            generative: dict[str, Any] = {}
            transport = protocol
            if protocol == "stream":
                try:
                    lengths = settings.lengths
                except InputError as exc:
                    raise TargetError(str(exc)) from None
                if settings.stream not in STREAM_PROTOCOLS:
                    raise TargetError(
                        f"--stream-protocol {settings.stream!r}: use one of "
                        f"{', '.join(STREAM_PROTOCOLS)}"
                    )
                generative = {"stream": settings.stream, "lengths": lengths.to_dict()}
                # grpc-stream speaks gRPC; the SSE protocols speak HTTP to the host.
                transport = "grpc" if settings.stream == "grpc-stream" else "http"
            url = settings.grpc_url if transport == "grpc" else settings.http_address
            key = (url, model, settings.http_url, settings.inputs, repr(generative))
            cached = self._contexts.get(protocol)
            if cached is not None and cached[0] == key:
                return cached[1]
            ctx = ProcessContext(0)
            ctx.configure(
                EngineConfig.from_dict(
                    {
                        "protocol": transport,
                        "url": url,
                        "model": model,
                        "mode": LoadMode.CONCURRENCY,
                        "rate_per_user": settings.rate_per_user,
                        "access": access_from_env().to_wire(),
                        "http_tls": is_tls(settings.http_url),
                        **dict(settings.inputs),
                        **generative,
                    }
                )
            )
            ctx.recorder = self.recorder
            self._contexts[protocol] = (key, ctx)
            return ctx


def live_state(environment: Environment) -> LiveState:
    """The process's ``LiveState`` (created on first use)."""
    state = getattr(environment, _STATE_ATTR, None)
    if state is None:
        state = LiveState(environment)
        setattr(environment, _STATE_ATTR, state)
    assert isinstance(state, LiveState)
    return state


def discover_model(http_url: str) -> str:
    """The first READY model in ``http_url``'s repository index (TargetError when none is)."""
    try:
        status, index = http_json(
            "POST",
            f"{http_url}/v2/repository/index",
            {},
            timeout_s=10.0,
            transport=UrllibTransport(access_from_env()),
        )
    except OSError as exc:
        raise TargetError(f"cannot reach {http_url}: {exc}") from exc
    ready = [m["name"] for m in index or [] if isinstance(m, dict) and m.get("state") == "READY"]
    if status != 200 or not ready:
        raise TargetError(
            f"no READY model found at {http_url} (HTTP {status}); pass --triton-model NAME"
        )
    if len(set(ready)) > 1:
        log.warning(
            "several models are ready on %s; using %s (set --triton-model)", http_url, ready[0]
        )
    return str(ready[0])


class _ClosedLoop(ClosedLoopUser):
    abstract = True
    protocol: ClassVar[str] = "http"

    def on_start(self) -> None:
        """Set up as the engine's user does, on the live context."""
        self.start_with(live_state(self.environment).context(self.protocol))


class _OpenLoop(OpenLoopUser):
    abstract = True
    protocol: ClassVar[str] = "http"

    def on_start(self) -> None:
        """Set up as the engine's dispatcher does, with the rate and arrival process from the form."""
        state = live_state(self.environment)
        ctx = state.context(self.protocol)
        assert ctx.config is not None
        settings = state.settings()
        if settings.rate_per_user <= 0:
            raise TargetError("--rate-per-user must be positive for open-loop users")
        try:
            arrival = parse_arrival(settings.arrival)
        except InputError as exc:
            raise TargetError(f"--arrival: {exc}") from None
        config = replace(
            ctx.config,
            mode=LoadMode.REQUEST_RATE,
            rate_per_user=settings.rate_per_user,
            arrival=arrival,
        )
        self.start_with(ctx, config)


class TritonHttpUser(_ClosedLoop):
    """Closed loop over HTTP: one request outstanding per user (users = concurrency)."""

    protocol = "http"


class TritonGrpcUser(_ClosedLoop):
    """Closed loop over gRPC: one request outstanding per user."""

    protocol = "grpc"


class TritonHttpOpenLoopUser(_OpenLoop):
    """Open loop over HTTP: each user offers ``--rate-per-user`` requests/second (CO-free latency)."""

    protocol = "http"


class TritonGrpcOpenLoopUser(_OpenLoop):
    """Open loop over gRPC: each user offers ``--rate-per-user`` requests/second."""

    protocol = "grpc"


class TritonStreamUser(_ClosedLoop):
    """A generative model, closed loop: one token stream at a time per user, over the form's
    ``--stream-protocol`` (TTFT, ITL and tokens timed per token)."""

    protocol = "stream"


class TritonStreamOpenLoopUser(_OpenLoop):
    """A generative model, open loop: each user starts ``--rate-per-user`` streams/second
    (TTFT from the intended send time)."""

    protocol = "stream"


USER_CLASSES = [
    TritonHttpUser,
    TritonGrpcUser,
    TritonHttpOpenLoopUser,
    TritonGrpcOpenLoopUser,
    TritonStreamUser,
    TritonStreamOpenLoopUser,
]
