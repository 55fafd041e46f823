"""``run_ui``: start (or reach) the target, then Locust's web UI with perfsweep's locustfile.

The dashboard runs in Locust's own process model: ``python -m locust -f <locustfile>`` with
``--class-picker``, plus ``--workers N`` worker processes (``locust --worker``) on loopback. Locust
owns argument parsing, the form, ``--web-login`` and shapes; perfsweep adds the users, the
Server tab and the target. This module itself never imports locust or gevent, so the CLI process
stays unpatched and the managed reference server stays a plain subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.config.access import PLAIN, ServerAccess
from analyzer.config.pipeline import engine_of, read_engine_file
from analyzer.config.urls import http_url as as_http_url
from analyzer.errors import InputError
from analyzer.load.web.options import (
    ACCESS_ENV,
    STREAM_CHOICES,
    exposure_problem,
    login_from_env,
)
from analyzer.measure.arrivals import parse_arrival
from analyzer.measure.lengths import Lengths, parse_length
from analyzer.target.managed import ManagedServer
from analyzer.target.remote import RemoteTarget
from analyzer.target.supervise import child_process_options

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
#: A generative model's: token-streaming users (``locustfile.py``'s answer each request once).
STREAM_LOCUSTFILE = Path(__file__).with_name("stream_locustfile.py")
REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class UiOptions:
    """What ``perfsweep ui`` needs.

    Attributes:
        url: HTTP URL of a running Triton-compatible server; None starts the reference server.
        model: Model to load-test (bundled model name when the reference server is started).
        device: Reference server device (``auto``, ``cpu``, ``cuda``, ``sim``).
        model_repository: Reference server repository (None: the bundled model).
        grpc_url: ``host:port`` for the gRPC users (None: the managed server's, or HTTP port + 1).
        metrics_url: Prometheus URL (None: the managed server's, or HTTP port + 2).
        web_host: Address the dashboard binds (loopback unless a login is configured).
        web_port: Dashboard port (0 = a free port, printed at startup).
        web_login: Require a login (user/password from ``PERFSWEEP_UI_USER``/``_PASSWORD``).
        workers: Locust worker processes (1 = users run in the dashboard's process).
        rate_per_user: Default open-loop rate per user, requests/second (editable in the form).
        arrival: Default open-loop arrival process, its short form (editable in the form).
        log_dir: Where the managed server's log and repository go.
        inputs: The request data (:func:`analyzer.load.engine.input_fields` of an ``[input]``
            section); empty: random data.
        access: TLS files and headers of a ``url`` server; Locust's processes get them in
            their environment (:data:`~analyzer.load.web.options.ACCESS_ENV`), never on their
            command line.
        stream: The generative users' streaming protocol, the form's starting value (None:
            the form's default, generate-stream). An OpenAI-compatible ``url`` server (vLLM,
            SGLang) is not asked Triton's health check.
        input_tokens: The generative users' prompt lengths, the form's starting value.
        output_tokens: The generative users' output lengths, the form's starting value.
        ttft_p99_ms: The TTFT goal that the dashboard's goodput counts.
        itl_p99_ms: The mean-ITL goal that the dashboard's goodput counts.
    """

    url: str | None = None
    model: str = "resnet50"
    device: str = "auto"
    model_repository: Path | None = None
    grpc_url: str | None = None
    metrics_url: str | None = None
    web_host: str = "127.0.0.1"
    web_port: int = 8089
    web_login: bool = False
    workers: int = 1
    rate_per_user: float = 10.0
    arrival: str = "poisson"
    log_dir: Path = Path("reports/ui")
    inputs: dict[str, Any] = field(default_factory=dict)
    access: ServerAccess = PLAIN
    stream: str | None = None
    input_tokens: str | None = None
    output_tokens: str | None = None
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None

    def check(self) -> None:
        """Refuse unsafe or impossible options before anything starts (``InputError``)."""
        problem = exposure_problem(self.web_host, self.web_login, login_from_env())
        if problem:
            raise InputError(problem)
        if self.workers < 1:
            raise InputError(f"--workers must be at least 1, got {self.workers}")
        if not 0 <= self.web_port <= 65535:
            raise InputError(f"--web-port must be 0..65535, got {self.web_port}")
        if self.rate_per_user <= 0:
            raise InputError(f"--user-rate-rps must be positive, got {self.rate_per_user}")
        if self.arrival.partition(":")[0] == "trace":
            raise InputError("--arrival trace: the dashboard's users draw streams of their own")
        parse_arrival(self.arrival)
        if self.stream is not None and self.stream not in STREAM_CHOICES:
            raise InputError(
                f"--protocol {self.stream!r}: the dashboard's generative users speak one of "
                f"{', '.join(STREAM_CHOICES)} (HTTP or gRPC users are picked in the form)"
            )
        Lengths(
            parse_length(self.input_tokens or "128", "--input-tokens"),
            parse_length(self.output_tokens or "64", "--output-tokens"),
        )
        for flag, goal in (("--ttft-p99-ms", self.ttft_p99_ms), ("--itl-p99-ms", self.itl_p99_ms)):
            if goal is not None and not goal > 0:
                raise InputError(f"{flag} must be positive, got {goal}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def locust_commands(
    options: UiOptions,
    http_url: str,
    grpc_url: str | None,
    metrics_url: str | None,
    engine_file: dict[str, Any] | None = None,
    generative: bool = False,
) -> tuple[list[str], list[list[str]]]:
    """The Locust master (web UI) command line and one command line per worker
    (``engine_file``: a generative model's engine settings as found, for the config form;
    ``generative``: the users stream tokens)."""
    locustfile = STREAM_LOCUSTFILE if generative else LOCUSTFILE
    base = [sys.executable, "-m", "locust", "-f", str(locustfile)]
    if options.inputs:  # every process builds its own requests from it, workers included
        base += ["--perfsweep-input", json.dumps(options.inputs, sort_keys=True)]
    master = [
        *base,
        "--host",
        http_url,
        "--web-host",
        options.web_host,
        "--web-port",
        str(options.web_port),
        "--class-picker",
        "--triton-model",
        options.model,
        "--rate-per-user",
        f"{options.rate_per_user:g}",
        "--arrival",
        options.arrival,
    ]
    form = {
        "--stream-protocol": options.stream,
        "--input-tokens": options.input_tokens,
        "--output-tokens": options.output_tokens,
        "--ttft-p99-ms": f"{options.ttft_p99_ms:g}" if options.ttft_p99_ms else None,
        "--itl-p99-ms": f"{options.itl_p99_ms:g}" if options.itl_p99_ms else None,
    }
    for flag, given in form.items():  # the form's starting values (workers get the form's)
        if given is not None:
            master += [flag, given]
    if engine_file is not None:
        master += ["--perfsweep-engine-file", json.dumps(engine_file, sort_keys=True)]
    if grpc_url:
        master += ["--grpc-url", grpc_url]
    if metrics_url:
        master += ["--metrics-url", metrics_url]
    if options.web_login:
        master.append("--web-login")
    workers: list[list[str]] = []
    if options.workers > 1:
        port = _free_port()
        master += ["--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port)]
        workers = [
            [*base, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)]
            for _ in range(options.workers)
        ]
    return master, workers


def streams(target: RemoteTarget) -> bool:
    """Whether the target's model answers with a stream of tokens (a decoupled model, or one
    a generative engine serves): its dashboard offers token-streaming users."""
    config = target.model_config()
    return bool(config.model_transaction_policy.decoupled) or engine_of(config) is not None


def _child_env(access: ServerAccess = PLAIN) -> dict[str, str]:
    # The locustfile imports ``analyzer``: make that work from a source checkout too.
    existing = os.environ.get("PYTHONPATH", "")
    root = str(REPO_ROOT)
    env = {**os.environ, "PYTHONPATH": root + (os.pathsep + existing if existing else "")}
    if access:
        env[ACCESS_ENV] = json.dumps(access.to_wire())
    return env


def _stop(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _silent(_: str) -> None:
    """The default ``on_status`` of a library call: say nothing."""


def run_ui(options: UiOptions, on_status: Callable[[str], Any] = _silent) -> int:
    """Serve the dashboard until Locust exits (Ctrl-C); return Locust's exit status.

    ``on_status`` receives the status lines (``perfsweep ui: starting the reference server``,
    ``perfsweep ui: target URL model M``); the CLI prints them.

    Raises:
        InputError: unsafe or invalid options (nothing was started).
        TargetError: the target could not be started or reached.
    """
    options.check()
    server: ManagedServer | None = None
    procs: list[subprocess.Popen[bytes]] = []
    previous = _terminate_as_interrupt()
    grpc_url: str | None
    metrics_url: str | None
    engine_file: dict[str, Any] | None = None
    try:
        if options.url is None:
            log_path = options.log_dir / "server.log"
            server = ManagedServer(
                options.model, options.device, log_path, options.model_repository
            )
            on_status(
                f"perfsweep ui: starting the reference server ({options.device}); log: {log_path}"
            )
            server.start()
            http_url = server.url
            assert server.addresses is not None  # set by start()
            grpc_url = options.grpc_url or server.addresses.grpc_url
            metrics_url = options.metrics_url or server.addresses.metrics_url
            if server.repository is not None:
                engine_file = read_engine_file(server.repository, options.model)
            target = RemoteTarget(http_url, options.model)
        else:
            http_url = as_http_url(options.url)  # the one check of a URL
            target = None
            if not (options.stream or "").startswith("openai"):
                # An OpenAI-compatible server (vLLM, SGLang) has no Triton health check to ask.
                target = RemoteTarget(http_url, options.model, access=options.access)
                target.notify = on_status
                target.start()  # a refused credential stops here (AccessDeniedError)
            grpc_url, metrics_url = options.grpc_url, options.metrics_url
        generative = options.stream is not None or (target is not None and streams(target))
        on_status(
            f"perfsweep ui: target {http_url} model {options.model}"
            + (" (token streams)" if generative else "")
        )
        master_cmd, worker_cmds = locust_commands(
            options, http_url, grpc_url, metrics_url, engine_file, generative
        )
        # Locust dies with this process too (kill -9 included), like the managed server.
        tie = child_process_options(_child_env(options.access))
        master = subprocess.Popen(master_cmd, **tie)
        procs.append(master)
        procs += [subprocess.Popen(cmd, stdin=subprocess.DEVNULL, **tie) for cmd in worker_cmds]
        return master.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        _stop(list(reversed(procs)))
        if server is not None:
            server.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminate_as_interrupt() -> Any:
    """Make SIGTERM unwind like Ctrl-C, so Locust and the managed server are stopped too."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, interrupt)
