"""Start the reference server: core + HTTP + gRPC + metrics in one asyncio loop.

``run_server(options)`` is what ``python -m reference_server`` and ``perfsweep serve`` call: it
prints one line with the bound ports once everything listens, and stops cleanly on SIGINT or
SIGTERM. :class:`ServerThread` runs the same server in a background thread of the current
process (port 0 everywhere), which is how tests and other modules get a real server::

    with ServerThread(ServerOptions(model_repositories=(repo,), models=("identity",))) as srv:
        client = tritonclient.http.InferenceServerClient(srv.http_url)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from reference_server.batching.rate_limiter import parse_resource_limit
from reference_server.core.cache import resolve_cache_size
from reference_server.core.errors import Code, ServerError
from reference_server.frontends.http import DEFAULT_MAX_INPUT_SIZE, DEFAULT_READ_TIMEOUT_S
from reference_server.frontends.restricted import (
    GRPC_HEADER_PREFIX,
    Restrictions,
    parse_restrictions,
)
from reference_server.ready import ServerAddresses

if TYPE_CHECKING:
    from reference_server.core.server import InferenceServer
    from reference_server.frontends.tls import GrpcTls

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerOptions:
    """Everything needed to start a reference server.

    Attributes:
        model_repositories: Model repository directories (``--model-repository``).
        models: Models to load at startup (``--model``); empty = every model in the
            repositories. Later loads/unloads go through the repository API (explicit mode).
        host: Address all three listeners bind; loopback unless told otherwise.
        http_port: KServe v2 HTTP/REST port; 0 = a free port.
        grpc_port: KServe v2 gRPC port; 0 = a free port.
        metrics_port: Prometheus ``/metrics`` port; 0 = a free port.
        device: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``sim``
            (the simulated-device backend).
        cache_size_bytes: Response cache size in bytes (``--cache-size``); 0 disables the
            cache unless ``cache_config`` sets one.
        max_input_size_bytes: ``--http-max-input-size``: largest JSON header or raw body.
        read_timeout_s: ``--http-read-timeout``: seconds an HTTP request body may send
            nothing before it is answered 408 and its connection closed (Triton has no
            such timeout; no real client pauses a minute inside one body).
        log_verbosity: 0 = warnings, 1 = info, 2 = debug.
        delay_scheduler: ``TRITONSERVER_DELAY_SCHEDULER`` test hook (batchers wait for this
            many queued requests before the first batch); None reads the environment variable.
        model_control_mode: ``explicit`` (the repository API loads and unloads; what perfsweep
            needs) or ``none`` (every model at startup, load/unload refused with 503), as
            ``tritonserver --model-control-mode``.
        rate_limit: ``--rate-limit``: ``off`` (Triton's default: instance ``rate_limiter``
            sections are ignored) or ``execution_count`` (honoured); case-insensitive.
        rate_limit_resources: ``--rate-limit-resource`` values, ``<name>:<count>[:<device>]``
            (resource names are case-sensitive, as in Triton 2.51).
        cache_config: ``--cache-config`` values, ``<cache name>,<setting>=<value>`` as
            ``tritonserver`` takes them (``local,size=1048576``); not with ``cache_size_bytes``.
        grpc_use_ssl: ``--grpc-use-ssl``: the gRPC port speaks TLS (needs ``grpc_server_cert``
            and ``grpc_server_key``); HTTP and metrics stay plain text, as in Triton.
        grpc_use_ssl_mutual: ``--grpc-use-ssl-mutual``: TLS that also requires a client
            certificate signed by ``grpc_root_cert`` (implies TLS).
        grpc_server_cert: ``--grpc-server-cert``: PEM certificate (chain) of the gRPC server.
        grpc_server_key: ``--grpc-server-key``: its PEM private key.
        grpc_root_cert: ``--grpc-root-cert``: PEM CA certificate client certificates are
            checked against (mutual TLS).
        http_restricted_apis: ``--http-restricted-api`` values,
            ``<group>[,<group>...]:<header>=<value>``: HTTP requests to those API groups
            without the header are answered 403 (groups in
            :data:`reference_server.frontends.restricted.GROUPS`).
        grpc_restricted_protocols: ``--grpc-restricted-protocol`` values, same format: gRPC
            calls of those groups without the metadata key ``triton-grpc-protocol-<header>``
            end UNAVAILABLE.
    """

    model_repositories: tuple[Path, ...] = ()
    models: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    device: str = "auto"
    cache_size_bytes: int = 0
    max_input_size_bytes: int = DEFAULT_MAX_INPUT_SIZE
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    log_verbosity: int = 0
    delay_scheduler: int | None = None
    model_control_mode: str = "explicit"
    rate_limit: str = "off"
    rate_limit_resources: tuple[str, ...] = ()
    cache_config: tuple[str, ...] = ()
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: Path | None = None
    grpc_server_key: Path | None = None
    grpc_root_cert: Path | None = None
    http_restricted_apis: tuple[str, ...] = ()
    grpc_restricted_protocols: tuple[str, ...] = ()
    #: ``--engine-setting KEY=VALUE`` values: the bundled generative model's engine settings
    #: (``1/model.json``, vLLM's names) over its own, as ``vllm serve`` takes them as flags.
    engine_settings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("http_port", "grpc_port", "metrics_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ServerError(
                    f"{name.replace('_', '-')} {port} is not a TCP port: use 0-65535 "
                    "(0 picks a free port)",
                    Code.INVALID_ARG,
                )
        if self.device not in ("auto", "cpu", "cuda", "sim"):
            raise ServerError(
                f"unknown device '{self.device}': use auto, cpu, cuda or sim", Code.INVALID_ARG
            )
        if self.model_control_mode not in ("explicit", "none"):
            raise ServerError(
                f"unknown model control mode '{self.model_control_mode}': use explicit or none",
                Code.INVALID_ARG,
            )
        if self.rate_limit.lower() not in ("off", "execution_count"):
            raise ServerError(
                f"invalid argument for --rate-limit: '{self.rate_limit}' (use off or "
                "execution_count)",
                Code.INVALID_ARG,
            )
        for value in self.rate_limit_resources:
            parse_resource_limit(value)  # raises with Triton's format message
        resolve_cache_size(self.cache_size_bytes, self.cache_config)  # raises as tritonserver
        if self.max_input_size_bytes <= 0:
            raise ServerError("the HTTP max input size must be positive", Code.INVALID_ARG)
        if not self.read_timeout_s > 0:
            raise ServerError(
                f"http-read-timeout {self.read_timeout_s} must be a positive number of seconds",
                Code.INVALID_ARG,
            )
        if self.grpc_tls and (self.grpc_server_cert is None or self.grpc_server_key is None):
            flag = "--grpc-use-ssl-mutual" if self.grpc_use_ssl_mutual else "--grpc-use-ssl"
            raise ServerError(
                f"{flag} needs --grpc-server-cert and --grpc-server-key: the PEM certificate "
                "and private key of the gRPC server",
                Code.INVALID_ARG,
            )
        # Parsed now, so that a malformed value fails here, with tritonserver's message.
        _ = (self.http_restrictions, self.grpc_restrictions)

    @property
    def response_cache_bytes(self) -> int:
        """The response cache size ``cache_size_bytes`` or ``cache_config`` sets; 0 = none."""
        return resolve_cache_size(self.cache_size_bytes, self.cache_config)

    @property
    def grpc_tls(self) -> bool:
        """Whether the gRPC port speaks TLS (mutual or not)."""
        return self.grpc_use_ssl or self.grpc_use_ssl_mutual

    @property
    def http_restrictions(self) -> Restrictions:
        """The parsed ``http_restricted_apis``."""
        return parse_restrictions(self.http_restricted_apis, option="http-restricted-api")

    @property
    def grpc_restrictions(self) -> Restrictions:
        """The parsed ``grpc_restricted_protocols`` (keys with Triton's metadata prefix)."""
        return parse_restrictions(
            self.grpc_restricted_protocols,
            option="grpc-restricted-protocol",
            header_prefix=GRPC_HEADER_PREFIX,
        )


class _Frontend(Protocol):
    """What app needs of a listener (HTTP, gRPC, metrics)."""

    async def start(self, host: str, port: int) -> int: ...

    async def stop(self) -> None: ...


class _Running:
    """The started pieces: listeners first (a busy port fails fast, before minutes of model
    loading), then the models; stopped core first, then the listeners."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.core: InferenceServer | None = None
        self._frontends: list[_Frontend] = []
        self._core_started = False
        self._scratch: Path | None = None

    async def start(self) -> ServerAddresses:
        from reference_server.frontends.grpc import GrpcFrontend
        from reference_server.frontends.http import HttpFrontend, MetricsFrontend

        options = self.options
        try:
            tls = _grpc_tls(options)
            repositories = options.model_repositories or (self._bundled_repository(),)
            core = _make_core(options, repositories)
            self.core = core
            host = options.host
            http = HttpFrontend(
                core,
                max_input_size=options.max_input_size_bytes,
                read_timeout_s=options.read_timeout_s,
                restrictions=options.http_restrictions,
            )
            http_port = await self._listen("HTTP", "--http-port", http, options.http_port)
            grpc = GrpcFrontend(core, tls=tls, restrictions=options.grpc_restrictions)
            grpc_port = await self._listen("gRPC", "--grpc-port", grpc, options.grpc_port)
            metrics = MetricsFrontend(core.metrics_text)
            metrics_port = await self._listen(
                "metrics", "--metrics-port", metrics, options.metrics_port
            )
            # Loading can take a while (ONNX sessions); keep the loop responsive meanwhile.
            loop = asyncio.get_running_loop()
            self._core_started = True
            await loop.run_in_executor(None, core.start)
            _check_startup_models(core, options, repositories)
        except BaseException:
            await self.stop()
            raise
        grpc_tls = "" if tls is None else "mutual" if tls.mutual else "tls"
        return ServerAddresses(host, http_port, grpc_port, metrics_port, grpc_tls=grpc_tls)

    async def _listen(self, what: str, flag: str, frontend: _Frontend, port: int) -> int:
        bound = await _bind(what, flag, self.options.host, port, frontend)
        self._frontends.append(frontend)
        return bound

    def _engine_settings(self) -> dict[str, str]:
        """``--engine-setting`` values as ``model.json`` keys (their values checked when the
        engine reads them)."""
        out: dict[str, str] = {}
        for item in self.options.engine_settings:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ServerError(
                    f"--engine-setting {item!r}: use KEY=VALUE (e.g. max_num_seqs=16)",
                    Code.INVALID_ARG,
                )
            out[key.strip()] = value.strip()
        return out

    def _bundled_repository(self) -> Path:
        """Materialise the bundled models asked for (no ``--model-repository`` given)."""
        from reference_server.zoo import tinyllm
        from reference_server.zoo.resnet50 import MODEL_NAME

        bundled = (MODEL_NAME, tinyllm.MODEL_NAME)
        unknown = [name for name in self.options.models if name not in bundled]
        if not self.options.models or unknown:
            raise ServerError(
                f"no model repository given and {unknown or 'no model'} is not a bundled "
                f"model: pass --model-repository DIR, or --model {MODEL_NAME} for the bundled "
                f"ResNet-50 (--model {tinyllm.MODEL_NAME} --device sim for the generative demo)",
                Code.INVALID_ARG,
            )
        if tinyllm.MODEL_NAME in self.options.models and self.options.device != "sim":
            raise ServerError(
                f"the bundled model {tinyllm.MODEL_NAME!r} is a simulation: run it with "
                f"--device sim (got {self.options.device!r})",
                Code.INVALID_ARG,
            )
        self._scratch = Path(tempfile.mkdtemp(prefix="perfsweep-zoo-"))
        if tinyllm.MODEL_NAME in self.options.models:
            tinyllm.make_repository(
                self._scratch, device=self.options.device, engine=self._engine_settings()
            )
        if MODEL_NAME in self.options.models:
            from reference_server.zoo.resnet50 import make_repository

            make_repository(self._scratch, device=self.options.device)
        return self._scratch

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        # The core drains first, while the frontends can still deliver the drained responses;
        # meanwhile new requests are answered UNAVAILABLE.
        if self.core is not None and self._core_started:
            self._core_started = False
            try:
                await loop.run_in_executor(None, self.core.stop)
            except Exception:
                logger.exception("error while stopping the core")
        for frontend in reversed(self._frontends):
            try:
                await frontend.stop()
            except Exception:
                logger.exception("error while stopping %s", type(frontend).__name__)
        self._frontends = []
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def _grpc_tls(options: ServerOptions) -> GrpcTls | None:
    """The gRPC listener's TLS material, read from its files (``None``: plain text)."""
    if not options.grpc_tls:
        return None
    from reference_server.frontends.tls import GrpcTls

    assert options.grpc_server_cert is not None and options.grpc_server_key is not None
    return GrpcTls.load(
        options.grpc_server_cert,
        options.grpc_server_key,
        options.grpc_root_cert,
        mutual=options.grpc_use_ssl_mutual,
    )


def _check_startup_models(
    core: InferenceServer, options: ServerOptions, repositories: tuple[Path, ...]
) -> None:
    """Fail startup, as tritonserver does, when a requested model did not load."""
    problems = []
    for entry in core.repository_index():
        if entry.get("state") == "UNAVAILABLE" and entry.get("reason"):
            name = entry["name"]
            missing = _missing_version_folder(core, name)
            if missing is not None:
                # Triton's reason blames the version policy; the usual cause is a model
                # directory without any version folder (git keeps no empty folder).
                problems.append(f"model '{name}' has no version folder: create {missing}/")
                continue
            problems.append(
                f"model '{name}' failed to load: {entry['reason'].rstrip()}; fix its config.pbtxt"
            )
    known = {entry["name"] for entry in core.repository_index()}
    for name in options.models:
        if name != "*" and name not in known:
            where = ", ".join(str(p) for p in repositories)
            problems.append(
                f"model '{name}' is not in the model repository ({where}): check --model and "
                "--model-repository"
            )
    if problems:
        raise ServerError("; ".join(problems), Code.INVALID_ARG)


def _missing_version_folder(core: InferenceServer, name: str) -> Path | None:
    """``<model dir>/1`` when model ``name``'s directory has no version folder at all, else None
    (one it cannot place: None too)."""
    from reference_server.core.repository import version_numbers

    try:
        directory = core.repository.locate(name)
    except ServerError:
        return None
    return None if version_numbers(directory) else directory / "1"


async def _bind(what: str, flag: str, host: str, port: int, frontend: _Frontend) -> int:
    try:
        bound = await frontend.start(host, port)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        hint = (
            f"the port is in use: stop the other server, choose another {flag}, "
            f"or pass {flag} 0 for a free port"
            if exc.errno in (errno.EADDRINUSE, None) or "bind" in str(exc).lower()
            else f"check the host address or choose another {flag}"
        )
        raise ServerError(
            f"cannot listen for {what} on {host}:{port} ({reason}); {hint}", Code.UNAVAILABLE
        ) from exc
    return bound


def _make_core(options: ServerOptions, repositories: tuple[Path, ...]) -> InferenceServer:
    from reference_server.core.server import CoreOptions, InferenceServer, delay_scheduler_from_env

    for repository in repositories:
        if not Path(repository).is_dir():
            raise ServerError(
                f"model repository '{repository}' is not a directory: pass an existing "
                "directory to --model-repository",
                Code.INVALID_ARG,
            )
    core_options = CoreOptions(
        model_repositories=tuple(Path(p) for p in repositories),
        model_control_mode="none" if options.model_control_mode == "none" else "explicit",
        # No --model means every model, as a user of "serve this repository" expects; the
        # repository API can still load and unload afterwards.
        startup_models=tuple(options.models) or ("*",),
        cache_size_bytes=options.response_cache_bytes,
        rate_limit="execution_count" if options.rate_limit.lower() == "execution_count" else "off",
        rate_limit_resources=tuple(parse_resource_limit(v) for v in options.rate_limit_resources),
        delay_scheduler=(
            delay_scheduler_from_env()
            if options.delay_scheduler is None
            else options.delay_scheduler
        ),
        # "sim" picks the simulated backend through the bundled model's config (zoo), not
        # through a core device.
        device="auto" if options.device == "sim" else options.device,
    )
    return InferenceServer(core_options)


async def serve(
    options: ServerOptions,
    stop: asyncio.Event,
    on_ready: Callable[[ServerAddresses, InferenceServer], None] | None = None,
) -> None:
    """Run the server in the current event loop until ``stop`` is set.

    Args:
        options: What to serve and where.
        stop: Set it (from the loop) to shut down cleanly.
        on_ready: Called once everything listens, with the bound addresses and the core.

    Raises:
        ServerError: Startup failed (bad repository or config, port in use); nothing is left
            running.
    """
    running = _Running(options)
    addresses = await running.start()
    try:
        assert running.core is not None
        if on_ready is not None:
            on_ready(addresses, running.core)
        await stop.wait()
    finally:
        await running.stop()


def run_server(options: ServerOptions) -> None:
    """Serve until SIGINT/SIGTERM, printing the bound ports on one line once ready.

    Uses uvloop when it is installed. Must run in the main thread (signal handlers).

    Raises:
        ServerError: Startup failed; the message says what to fix.
    """
    _configure_logging(options.log_verbosity)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)

        def announce(addresses: ServerAddresses, core: InferenceServer) -> None:
            print(addresses.ready_line(), flush=True)

        await serve(options, stop, announce)

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:  # pragma: no cover - a dependency except on Windows, where it does not exist
        uvloop.run(main())


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


class ServerThread:
    """A reference server in a background thread of this process, for tests and tools.

    Ports default to 0 (free ports). Use as a context manager; ``addresses``, ``http_url``,
    ``grpc_url``, ``metrics_url`` and ``core`` are available inside the block.

    Args:
        options: Server options; the three ports are forced to 0 unless ``keep_ports``.
        startup_timeout_s: How long ``__enter__`` waits for the server to listen.
        keep_ports: Use the ports in ``options`` as given.
    """

    def __init__(
        self,
        options: ServerOptions,
        *,
        startup_timeout_s: float = 300.0,
        keep_ports: bool = False,
    ) -> None:
        if not keep_ports:
            options = dataclasses.replace(options, http_port=0, grpc_port=0, metrics_port=0)
        self.options = options
        self._timeout = startup_timeout_s
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._addresses: ServerAddresses | None = None
        self._core: InferenceServer | None = None

    @property
    def addresses(self) -> ServerAddresses:
        """Bound addresses (only valid while started)."""
        if self._addresses is None:
            raise RuntimeError("the server is not running")
        return self._addresses

    @property
    def core(self) -> InferenceServer:
        """The in-process core, for assertions that need no protocol."""
        if self._core is None:
            raise RuntimeError("the server is not running")
        return self._core

    @property
    def http_url(self) -> str:
        """``127.0.0.1:<port>`` for ``tritonclient.http``."""
        return self.addresses.http_url

    @property
    def grpc_url(self) -> str:
        """``127.0.0.1:<port>`` for ``tritonclient.grpc``."""
        return self.addresses.grpc_url

    @property
    def metrics_url(self) -> str:
        """``http://127.0.0.1:<port>/metrics``."""
        return self.addresses.metrics_url

    def start(self) -> ServerThread:
        """Start the thread and wait until the server listens (or raise its startup error)."""
        self._thread = threading.Thread(target=self._run, name="reference-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(self._timeout):
            self.stop()
            raise TimeoutError(f"reference server did not start within {self._timeout} s")
        if self._error is not None:
            self.stop()
            raise self._error
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Shut the server down and join the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self._addresses = None
        self._core = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def on_ready(addresses: ServerAddresses, core: InferenceServer) -> None:
                self._addresses = addresses
                self._core = core
                self._ready.set()

            await serve(self.options, self._stop, on_ready)

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()


__all__ = [
    "ServerAddresses",
    "ServerOptions",
    "ServerThread",
    "run_server",
    "serve",
]
