"""perfsweep's custom Locust arguments and the target settings read from them (no gevent here).

The arguments are added to Locust's own parser (``init_command_line_parser``), so they work the
same under ``perfsweep ui`` and a plain ``locust -f scenarios/locustfile.py``; the ones marked
``include_in_web_ui`` appear in the web form's "Custom parameters" and reach every worker when a
test starts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from analyzer.config.access import ServerAccess
from analyzer.config.urls import metrics_url_of
from analyzer.measure.lengths import Lengths, parse_length

#: Environment variables holding the dashboard login (never on the command line: ``ps`` shows it).
USER_ENV = "PERFSWEEP_UI_USER"
PASSWORD_ENV = "PERFSWEEP_UI_PASSWORD"
DEFAULT_USER = "perfsweep"

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: The generative users' streaming protocols (``analyzer.load.streams.STREAM_PROTOCOLS``, named
#: here too: this module imports no gevent) and the one they speak unless told otherwise.
STREAM_CHOICES = ("generate-stream", "grpc-stream", "openai", "openai-chat")
DEFAULT_STREAM = "generate-stream"
#: The TLS files and headers of the target (``ServerAccess.to_wire`` as JSON), set by the
#: launcher in the environment of Locust's processes: never on a command line or on disk.
ACCESS_ENV = "PERFSWEEP_ACCESS"


def add_arguments(parser: Any) -> None:
    """Add perfsweep's options to Locust's argument parser (a ``LocustArgumentParser``)."""
    # Locust's parser takes ``include_in_web_ui`` only on top-level arguments, not in groups.
    group = parser
    group.add_argument(
        "--triton-model",
        default="",
        include_in_web_ui=True,
        help="Model to load-test (default: the first READY model in the repository index).",
    )
    group.add_argument(
        "--grpc-url",
        default="",
        include_in_web_ui=True,
        help="gRPC HOST:PORT for the gRPC users (default: the HTTP port + 1, Triton's layout).",
    )
    group.add_argument(
        "--metrics-url",
        default="",
        help="Prometheus URL of the target (default: HTTP port + 2, Triton's layout).",
    )
    group.add_argument(
        "--rate-per-user",
        type=float,
        default=10.0,
        include_in_web_ui=True,
        help="Open-loop users: requests/second each user offers (users x rate = offered load).",
    )
    group.add_argument(
        "--arrival",
        default="poisson",
        include_in_web_ui=True,
        help="Open-loop users: arrival process (poisson, constant, gamma:cv=2, "
        "mmpp:4@0.5,0.25@2, ramp:start=0.5,end=1.5,period_s=60, "
        "diurnal:amplitude=0.5,period_s=60); each user draws a stream of its own.",
    )
    group.add_argument(
        "--perfsweep-input",
        default="",
        help="The request data as JSON (perfsweep ui passes its --shape / --input-data / "
        "--batch-size / --unique-payloads / --repeat-ratio here; default: random data).",
    )
    group.add_argument(
        "--stream-protocol",
        default=DEFAULT_STREAM,
        include_in_web_ui=True,
        help="Generative users (TritonStream*): the streaming protocol, one of "
        f"{', '.join(STREAM_CHOICES)} (grpc-stream goes to --grpc-url, the rest to the host).",
    )
    group.add_argument(
        "--input-tokens",
        default="128",
        include_in_web_ui=True,
        help="Generative users: prompt length in tokens, N, uniform:LO,HI or "
        "lognormal:mean=M,sd=S.",
    )
    group.add_argument(
        "--output-tokens",
        default="64",
        include_in_web_ui=True,
        help="Generative users: tokens to generate per request (as --input-tokens).",
    )
    group.add_argument(
        "--ttft-p99-ms",
        type=float,
        default=0.0,
        include_in_web_ui=True,
        help="Generative users: the time-to-first-token goal of goodput, ms (0: none).",
    )
    group.add_argument(
        "--itl-p99-ms",
        type=float,
        default=0.0,
        include_in_web_ui=True,
        help="Generative users: the inter-token-latency goal of goodput (each request's mean "
        "ITL), ms (0: none).",
    )
    group.add_argument(
        "--perfsweep-engine-file",
        default="",
        help="A generative model's engine settings as found (its 1/model.json, JSON; perfsweep "
        "ui passes the managed server's): the config form's starting values.",
    )
    group.add_argument(
        "--shape-period-s",
        type=float,
        default=60.0,
        include_in_web_ui=True,
        help="Load shapes: ramp length, spike period, or the length of a diurnal 'day' (seconds).",
    )
    group.add_argument(
        "--spike-factor",
        type=float,
        default=3.0,
        include_in_web_ui=True,
        help="Spike shape: users during a spike = users x this factor.",
    )


@dataclass(frozen=True)
class TargetSettings:
    """Where the Triton users send requests and where the dashboard reads the server's view.

    Attributes:
        http_url: ``http://host:port`` (Locust's host).
        model: Model name ("" = discover).
        grpc_url: ``host:port`` of the gRPC endpoint.
        metrics_url: Full Prometheus URL.
        rate_per_user: Open-loop requests/second per user.
        arrival: the short form of an arrival process (``analyzer.measure.arrivals``).
        inputs: The request-data fields of the generator's ``EngineConfig``
            (:func:`analyzer.load.engine.input_fields`); empty: random data.
        stream: The generative users' streaming protocol (one of :data:`STREAM_CHOICES`).
        input_tokens: The generative users' prompt lengths (``--input-tokens``'s forms).
        output_tokens: The generative users' output lengths.
        ttft_p99_ms: The TTFT goal that goodput counts (None: none).
        itl_p99_ms: The goal of each request's mean ITL that goodput counts (None: none).
    """

    http_url: str
    model: str = ""
    grpc_url: str = ""
    metrics_url: str = ""
    rate_per_user: float = 10.0
    arrival: str = "poisson"
    inputs: tuple[tuple[str, Any], ...] = ()
    stream: str = DEFAULT_STREAM
    input_tokens: str = "128"
    output_tokens: str = "64"
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None

    @property
    def lengths(self) -> Lengths:
        """The generative users' request lengths (``InputError`` when a form value is bad)."""
        return Lengths(
            parse_length(self.input_tokens, "--input-tokens"),
            parse_length(self.output_tokens, "--output-tokens"),
        )

    @property
    def http_address(self) -> str:
        """``host:port`` without a scheme (what tritonclient expects)."""
        parts = urlsplit(self.http_url if "://" in self.http_url else f"http://{self.http_url}")
        return parts.netloc

    @classmethod
    def from_locust(cls, host: str | None, parsed_options: Any) -> TargetSettings:
        """Build from Locust's host and parsed options (defaults follow Triton's port layout)."""
        if not host:
            raise ValueError(
                "no target: set the Host field to the server's HTTP URL, e.g. http://127.0.0.1:8000"
            )
        http_url = host.rstrip("/")
        if "://" not in http_url:
            http_url = "http://" + http_url
        parts = urlsplit(http_url)
        hostname = parts.hostname or "127.0.0.1"
        port = parts.port or 80
        shown = f"[{hostname}]" if ":" in hostname else hostname

        def opt(name: str, default: Any) -> Any:
            value = getattr(parsed_options, name, None) if parsed_options is not None else None
            return default if value in (None, "") else value

        return cls(
            http_url=http_url,
            model=str(opt("triton_model", "")),
            grpc_url=str(opt("grpc_url", f"{shown}:{port + 1}")),
            metrics_url=str(opt("metrics_url", metrics_url_of(http_url))),
            rate_per_user=float(opt("rate_per_user", 10.0)),
            arrival=str(opt("arrival", "poisson")),
            inputs=tuple(sorted(json.loads(opt("perfsweep_input", "{}")).items())),
            stream=str(opt("stream_protocol", DEFAULT_STREAM)),
            input_tokens=str(opt("input_tokens", "128")),
            output_tokens=str(opt("output_tokens", "64")),
            # 0 in the form: no goal.
            ttft_p99_ms=float(opt("ttft_p99_ms", 0.0)) or None,
            itl_p99_ms=float(opt("itl_p99_ms", 0.0)) or None,
        )


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the dashboard on this machine ("" = all interfaces: no)."""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def login_from_env(environ: Any = os.environ) -> tuple[str, str] | None:
    """(user, password) from ``PERFSWEEP_UI_USER`` / ``PERFSWEEP_UI_PASSWORD``; None when unset."""
    password = environ.get(PASSWORD_ENV, "")
    if not password:
        return None
    return environ.get(USER_ENV, "") or DEFAULT_USER, password


def exposure_problem(web_host: str, web_login: bool, credentials: tuple[str, str] | None) -> str:
    """Why serving the dashboard this way is unsafe ("" when it is fine)."""
    if web_login and credentials is None:
        return (
            f"--web-login needs a password: set {PASSWORD_ENV} (and optionally {USER_ENV}, "
            f"default {DEFAULT_USER!r}) in the environment"
        )
    if is_loopback(web_host) or web_login:
        return ""
    shown = web_host or "all interfaces"
    return (
        f"refusing to serve the dashboard on {shown} without a login: anyone who can reach it "
        "could start load against your server and change its model config. Bind 127.0.0.1 "
        f"(the default), or add --web-login and set {PASSWORD_ENV} (and optionally {USER_ENV})"
    )


def request_problem(method: str, host_header: str, origin: str | None, bound_host: str) -> str:
    """Why the dashboard should refuse one HTTP request ("" to serve it).

    Locust's web UI answers CORS requests from any origin, so a web page the user visits could
    otherwise start load or reconfigure the model through a loopback-bound dashboard:

    * a state-changing request whose ``Origin`` is not the dashboard itself is refused;
    * on a loopback-bound dashboard, a ``Host`` that is not a loopback name is refused (a DNS
      rebinding page reaches 127.0.0.1 under its own host name).
    """
    host_name = urlsplit(f"http://{host_header}").hostname or ""
    if is_loopback(bound_host) and not is_loopback(host_name):
        return f"this dashboard only answers to loopback host names, not {host_name!r}"
    changes_state = method.upper() not in ("GET", "HEAD", "OPTIONS")
    if changes_state and origin and urlsplit(origin).netloc.lower() != host_header.lower():
        return f"cross-origin {method} from {origin} refused"
    return ""


def access_from_env(environ: Any = os.environ) -> ServerAccess:
    """The target's TLS files and headers as the launcher passed them (none when unset)."""
    raw = environ.get(ACCESS_ENV, "")
    return ServerAccess.from_wire(json.loads(raw) if raw else None)
