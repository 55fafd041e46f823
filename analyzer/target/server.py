"""The server under test, behind one protocol.

Two implementations:

* :class:`ManagedServer`: a server process perfsweep starts on loopback with free ports, its
  output appended to a log file in the run directory; it is restarted when it dies. The
  reference server (``python -m reference_server``) by default;
  :class:`analyzer.target.triton.ManagedTriton` is the same target with a real ``tritonserver``
  (``--server triton``): it only overrides how the process is prepared, launched and awaited.
* :class:`RemoteTarget`: a server that is already running at ``--url`` (a real Triton or a
  reference server); never restarted.

Both push a config the same way Triton's Model Analyzer does in remote mode, without a
restart: ``POST /v2/repository/models/<m>/load`` with ``{"parameters": {"config": <JSON>}}``,
then wait until the model is ready. Only plain HTTP (urllib) is used here, so no gevent or
tritonclient import is needed to manage a target.

Jobs are split: :mod:`analyzer.target.supervise` runs the server process (dies with this process, log
file, wait for the ready line, SIGTERM then SIGKILL); :mod:`analyzer.target.transport` carries the HTTP
calls (a ``MockTransport`` in tests); :func:`bundled_repository` writes a bundled model's
repository; :func:`read_device_info` scrapes what each instance runs on. :class:`ManagedServer`
composes them. :func:`analyzer.target.factory.make_target` picks the target a scenario describes
(sweep and gate alike); it sits above this module and :mod:`analyzer.target.triton`, which
builds on :class:`ManagedServer`.

A server that outlives the sweep (``--url``) may be named by several workers of one study:
:func:`claim_target` keeps a lease per server and model in the study (its user attributes,
through :class:`LeaseStore`) and refuses a second live worker with :class:`TargetInUseError`.

Only ``http://`` URLs are accepted (:func:`analyzer.config.urls.http_url`, the one place URLs enter):
TLS is not implemented end to end, so an ``https://`` URL is refused rather than sent as plain
HTTP.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.urls import http_url
from analyzer.errors import TargetDiedError, TargetError
from analyzer.target.liveness import live, wait_for_return
from analyzer.target.server_stats import parse_device_info
from analyzer.target.supervise import Supervisor
from analyzer.target.transport import Request, Transport, UrllibTransport
from reference_server.ready import ServerAddresses, last_ready


class ConfigRejectedError(TargetError):
    """The server refused a config (the trial fails; the sweep goes on)."""


def untunable_reason(config: mc.ModelConfig) -> str | None:
    """Why perfsweep must not tune this model, or None.

    ``dynamic_batching``, ``sequence_batching`` and ``ensemble_scheduling`` share one proto
    ``oneof``: setting the first erases the others, which would silently change what an ensemble
    or a stateful model means. A stateful model with the sequence batcher's ``oldest`` strategy
    is tuned in place (:func:`analyzer.config.knobs.apply_knobs` writes into ``oldest``); the
    ``direct`` strategy has nothing to tune, and an ensemble schedules its composing models.
    """
    kind = config.WhichOneof("scheduling_choice")
    if config.platform == "ensemble" or kind == "ensemble_scheduling":
        return (
            f'model {config.name!r} is an ensemble (platform "ensemble" / '
            "ensemble_scheduling), which has no batcher of its own: its composing models do the "
            "batching. perfsweep can tune each composing model by name instead (dynamic_batching, "
            "or sequence_batching with the oldest strategy)"
        )
    if kind == "sequence_batching" and not config.sequence_batching.HasField("oldest"):
        return (
            f"model {config.name!r} is sequence-batched with the direct strategy (a stateful "
            "model): the direct strategy has no batching delay to tune (a batch is every "
            "slot's next request); use oldest "
            "(sequence_batching { oldest { ... } }), whose max_queue_delay_microseconds, "
            "preferred_batch_size and max_candidate_sequences perfsweep tunes with the instance "
            "count and max_batch_size"
        )
    return None


class Target(Protocol):
    """The server under test.

    Attributes:
        model: The model being tuned.
        url: Base HTTP URL (``http://host:port``).
        device: ``sim``, ``cpu``, ``cuda`` for a managed server; ``remote`` otherwise.
        shared: The server outlives the sweep (``--url``): the sweep must leave it on a
            known config. A managed server is stopped instead.
        notify: Told what the target does about a dead server (a restart, a wait): the live
            view sets it.
    """

    model: str
    url: str
    device: str
    shared: bool
    notify: Callable[[str], None]

    def start(self) -> None:
        """Start (or connect to) the server and wait until the model is ready."""
        ...

    def stop(self) -> None:
        """Stop what :meth:`start` started (a remote server is left running)."""
        ...

    def model_config(self) -> mc.ModelConfig:
        """The model's current config as the server reports it."""
        ...

    def load_config(self, config: mc.ModelConfig) -> None:
        """Reload the model with ``config`` (no server restart) and wait until it is ready."""
        ...

    def ensure_alive(self) -> None:
        """Return when the server answers. A dead managed server is restarted; a dead ``--url``
        server is waited for (``run.server_wait_s``). Either way the last config loaded is
        loaded again.

        Raises:
            TargetDiedError: The server is dead and cannot be brought back.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """Facts for the summary: kind, url, device, server version."""
        ...


# --------------------------------------------------------------------------------------------------
# HTTP helpers


def _error_text(payload: Any) -> str:
    if isinstance(payload, dict) and "error" in payload:
        return str(payload["error"])
    return str(payload)


def config_to_json(config: mc.ModelConfig) -> str:
    """A ModelConfig as the JSON string the repository ``load`` override expects."""
    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)


def config_from_json(data: dict[str, Any]) -> mc.ModelConfig:
    """Parse a server's ``GET .../config`` JSON (unknown fields from newer servers ignored)."""
    return json_format.ParseDict(data, mc.ModelConfig(), ignore_unknown_fields=True)


def read_device_info(
    metrics_url: str, model: str, transport: Transport | None = None
) -> list[dict[str, str]]:
    """What each instance of ``model`` runs on, scraped from ``metrics_url``.

    Read from the reference server's ``perfsweep_model_device_info`` metric (backend, device,
    execution provider or simulated profile); empty when it cannot be read.
    """
    if not metrics_url:
        return []
    try:
        answer = (transport or UrllibTransport()).request(Request("GET", metrics_url, None, 5.0))
    except OSError:
        return []
    if answer.status != 200:
        return []
    return parse_device_info(answer.text(), model)


def observed_device(devices: list[dict[str, str]], requested: str) -> str:
    """``sim``, ``cuda`` or ``cpu`` as the server reports it; ``requested`` when unknown."""
    if not devices:
        return requested
    if all(d.get("backend") == "simulated" for d in devices):
        return "sim"
    kinds = {d.get("device", "") for d in devices}
    return "cuda" if "cuda" in kinds else (kinds.pop() if len(kinds) == 1 else requested)


class _HttpTarget:
    """What both targets share: the KServe v2 HTTP calls, through :attr:`transport`.

    ``clock`` and ``sleep`` pace the waits for readiness (tests pass a fake clock).
    """

    model: str
    url: str
    load_timeout_s: float = 300.0
    transport: Transport
    clock: Callable[[], float] = staticmethod(time.monotonic)
    sleep: Callable[[float], None] = staticmethod(time.sleep)
    notify: Callable[[str], None] = staticmethod(lambda text: None)
    #: The last config :meth:`load_config` pushed (loaded again into a server that returns).
    _last_config: mc.ModelConfig | None = None

    def _call(
        self, method: str, path: str, body: Any = None, timeout_s: float = 10.0
    ) -> tuple[int, Any]:
        """(status, decoded JSON or text) of one request; :class:`OSError` when no answer."""
        answer = self.transport.request(Request(method, self.url + path, body, timeout_s))
        return answer.status, answer.payload()

    def _get(self, path: str, timeout_s: float = 10.0) -> tuple[int, Any]:
        return self._call("GET", path, timeout_s=timeout_s)

    def _is_live(self) -> bool:
        return live(self.url, self.transport)

    def _is_ready(self) -> bool:
        try:
            status, _ = self._get(f"/v2/models/{self.model}/ready", timeout_s=5.0)
        except OSError:
            return False
        return status == 200

    def model_config(self) -> mc.ModelConfig:
        try:
            status, payload = self._get(f"/v2/models/{self.model}/config")
        except OSError as exc:
            raise TargetError(
                f"cannot read the config of {self.model} from {self.url}: {exc}"
            ) from exc
        if status != 200 or not isinstance(payload, dict):
            raise TargetError(
                f"{self.url} has no model {self.model!r} ({status}: {_error_text(payload)}); "
                "check --model and that the server loaded it"
            )
        return config_from_json(payload)

    def load_config(self, config: mc.ModelConfig) -> None:
        body = {"parameters": {"config": config_to_json(config)}}
        path = f"/v2/repository/models/{self.model}/load"
        try:
            status, payload = self._call("POST", path, body, timeout_s=self.load_timeout_s)
        except OSError as exc:
            if not self._is_live():
                raise TargetDiedError(
                    f"the server at {self.url} died while loading a config: {exc}", self.url
                ) from exc
            raise TargetError(f"loading a config into {self.url} failed: {exc}") from exc
        if status != 200:
            # A server that still answers refused this config (Triton reports a refused override
            # as 400 or as a 500 "failed to load"): the trial fails, the sweep goes on. A server
            # that went away died (restart or wait, and retry).
            if self._is_live():
                raise ConfigRejectedError(
                    f"the server refused the config ({status}): {_error_text(payload)}"
                )
            raise TargetDiedError(
                f"the server at {self.url} died while loading a config ({status}: "
                f"{_error_text(payload)})",
                self.url,
            )
        deadline = self.clock() + self.load_timeout_s
        while not self._is_ready():
            if not self._is_live():
                raise TargetDiedError(
                    f"the server at {self.url} died while loading {self.model}", self.url
                )
            if self.clock() > deadline:
                raise TargetError(
                    f"{self.model} was not ready {self.load_timeout_s:.0f} s after load"
                )
            self.sleep(0.1)
        self._last_config = config

    def server_metadata(self) -> dict[str, Any]:
        try:
            status, payload = self._get("/v2")
        except OSError:
            return {}
        return payload if status == 200 and isinstance(payload, dict) else {}


# --------------------------------------------------------------------------------------------------
# Remote


class RemoteTarget(_HttpTarget):
    """A running server at ``url`` (real Triton in explicit model-control mode, or ours).

    Args:
        url: The server's HTTP address (``http://`` added when missing; ``https://`` refused).
        model: The model to tune.
        timeout_s: How long :meth:`start` waits for the server to answer ready.
        wait_s: How long :meth:`ensure_alive` waits for a server that stopped answering to
            return (a restarted pod) before the run stops (``run.server_wait_s``).
        transport: The HTTP seam (default: urllib).
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
    ) -> None:
        self.url = http_url(url)
        self.model = model
        self.device = "remote"
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self.outages: list[dict[str, Any]] = []
        #: ``GET /v2`` as read at start (and after an outage): describing a server that has
        #: died since must not wait on it.
        self._metadata: dict[str, Any] = {}
        self.transport = transport or UrllibTransport()
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
                status, _ = self._get("/v2/health/ready", timeout_s=2.0)
                if status == 200:
                    break
                last = f"HTTP {status}"
            except OSError as exc:
                last = str(getattr(exc, "reason", exc))
            self.sleep(0.2)
        else:
            raise TargetError(f"cannot reach the server at {self.url} ({last}); check --url")
        if not self._is_ready():
            raise TargetError(
                f"model {self.model!r} is not ready on {self.url}; load it first "
                "(the server must run with --model-control-mode=explicit for perfsweep to reload it)"
            )
        self._metadata = self.server_metadata()

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
                f"{self.wait_s:g} s (run.server_wait_s, --server-wait)",
                self.url,
            )
        self._metadata = self.server_metadata()
        if self._last_config is not None:
            self.load_config(self._last_config)

    def describe(self) -> dict[str, Any]:
        meta = self._metadata or self.server_metadata()
        return {
            "kind": "remote",
            "url": self.url,
            "device": self.device,
            "server": meta.get("name"),
            "server_version": meta.get("version"),
            "outages": list(self.outages),
        }


# --------------------------------------------------------------------------------------------------
# Managed reference server


#: How a child process writes each bundled model's repository (``MODEL ROOT DEVICE`` follow):
#: the zoo's resnet50 module, or the accumulator's ``make_repository``. Unknown models go to
#: the resnet50 writer, which says that they are not bundled.
_BUNDLED_WRITERS: dict[str, list[str]] = {
    "resnet50": ["-m", "reference_server.zoo.resnet50"],
    "accumulator": [
        "-c",
        "import sys; from pathlib import Path; "
        "from reference_server.zoo.accumulator import make_repository; "
        "make_repository(Path(sys.argv[2]))",
    ],
}

#: Bundled models that run only on the simulated device (their backend is a simulation).
_SIM_ONLY = frozenset({"accumulator"})


def bundled_repository(
    model: str, root: Path, device: str, python: str = sys.executable, timeout_s: float = 180.0
) -> Path:
    """Write the repository of bundled model ``model`` under ``root`` (kept when already there).

    The bundled models are ``resnet50`` and the stateful ``accumulator``
    (:mod:`reference_server.zoo.accumulator`, sequence batching with the oldest strategy, on the
    simulated device only). Runs the zoo in a child process (``python -m
    reference_server.zoo.resnet50``, or the accumulator's ``make_repository``) rather than
    calling ``make_repository`` here: the zoo imports onnx (and builds a 100 MB graph on first
    use), which the analyzer process must not import.

    Raises:
        TargetError: ``model`` is not a bundled model, runs only on the simulated device and
            another was asked for, or the repository could not be written.
    """
    if model in _SIM_ONLY and device != "sim":
        raise TargetError(
            f"the bundled model {model!r} is a simulation: run it with --device sim "
            f"(got {device!r}), or pass --model-repository DIR for your own models"
        )
    root = Path(root).resolve()
    if (root / model / "config.pbtxt").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    writer = _BUNDLED_WRITERS.get(model, _BUNDLED_WRITERS["resnet50"])
    done = subprocess.run(
        [python, *writer, model, str(root), device],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=root.parent,
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise TargetError(
            f"cannot prepare the bundled model {model!r}: {tail}; "
            "pass --model-repository DIR for your own models"
        )
    return root


class ManagedServer(_HttpTarget):
    """A server subprocess on loopback with free ports: the reference server by default.

    Composes a :class:`~analyzer.target.supervise.Supervisor` (the process and its log), the ready line
    (:func:`reference_server.ready.last_ready`), :func:`bundled_repository` and
    :func:`read_device_info`; the HTTP calls are the shared :class:`_HttpTarget` ones.

    The life cycle (start, restart a dead server and reload its last config, stop) is this
    class's alone. Another server overrides the hooks: :meth:`_prepare` (files the process
    needs), :meth:`command`, :meth:`_new_supervisor` and :meth:`_await_ready` (see
    :class:`analyzer.target.triton.ManagedTriton`).

    Args:
        model: Model to load (a bundled model name, or a model in ``repository``).
        device: ``auto``, ``cpu``, ``cuda`` or ``sim``.
        log_path: File that receives the server's stdout and stderr (appended on restart).
        repository: Model repository directory; None for a bundled model.
        startup_timeout_s: How long to wait for the ready line and the model.
        python: Interpreter to run the server with.
        transport: The HTTP seam (default: urllib).
    """

    shared = False
    #: What the server is, in messages ("the reference server died ...").
    server_name = "the reference server"
    #: ``describe()["managed_server"]``: which server perfsweep manages.
    server_kind = "reference"

    def __init__(
        self,
        model: str,
        device: str,
        log_path: Path,
        repository: Path | None = None,
        startup_timeout_s: float = 180.0,
        python: str = sys.executable,
        transport: Transport | None = None,
    ) -> None:
        self.model = model
        self.device = device
        # Absolute paths: the server and the repository writer run in other working directories.
        self.log_path = Path(log_path).resolve()
        self.repository = Path(repository).resolve() if repository is not None else None
        self.startup_timeout_s = startup_timeout_s
        self.python = python
        self.transport = transport or UrllibTransport()
        self.url = ""
        self.metrics_url = ""
        #: Where the running server listens (its ready line); None until started.
        self.addresses: ServerAddresses | None = None
        self.restarts = 0
        self._process: Supervisor | None = None

    def command(self, ports: ServerAddresses | None = None) -> list[str]:
        """The server's command line: free ports, or those of ``ports`` (a restart)."""
        http, grpc, metrics = (
            (ports.http_port, ports.grpc_port, ports.metrics_port) if ports else (0, 0, 0)
        )
        cmd = [
            self.python,
            "-m",
            "reference_server",
            "--model",
            self.model,
            "--device",
            self.device,
            "--host",
            "127.0.0.1",
            "--http-port",
            str(http),
            "--grpc-port",
            str(grpc),
            "--metrics-port",
            str(metrics),
        ]
        if self.repository is not None:
            cmd += ["--model-repository", str(self.repository)]
        return cmd

    def _prepare(self) -> None:
        """Make what the process needs before its first start: a bundled model's repository."""
        if self.repository is None:
            self.repository = bundled_repository(
                self.model,
                self.log_path.parent / "repository",
                self.device,
                self.python,
                self.startup_timeout_s,
            )

    def _new_supervisor(self) -> Supervisor:
        """The supervisor of this server's process (after :meth:`_prepare`)."""
        return Supervisor(
            self.command(),
            self.log_path,
            name=self.server_name,
            label="server",
            env={"PYTHONUNBUFFERED": "1"},
        )

    def _supervisor(self) -> Supervisor:
        """The server's process supervisor (made on first use, once the repository exists)."""
        if self._process is None:
            self._prepare()
            self._process = self._new_supervisor()
        return self._process

    def _relaunch_command(self, ports: ServerAddresses | None) -> list[str]:
        """The command line of a restart on ``ports``, the ports the dead server had (None: free
        ones): the load generator and everything else that holds :attr:`url` keep reaching it."""
        return self.command(ports)

    def _await_ready(self, process: Supervisor) -> None:
        """Read the ports from the ready line, then wait until the model is ready."""
        deadline = self.clock() + self.startup_timeout_s
        addresses: ServerAddresses = process.wait_for(last_ready, self.startup_timeout_s)
        self.addresses = addresses
        self.url = f"http://{addresses.http_url}"
        self.metrics_url = addresses.metrics_url
        while not self._is_ready():
            if not process.running() or self.clock() > deadline:
                raise TargetError(f"model {self.model!r} never became ready (log: {self.log_path})")
            self.sleep(0.2)

    def start(self) -> None:
        """Start the subprocess, read its ports from the log, wait until the model is ready."""
        process = self._supervisor()
        process.start()
        self._await_ready(process)

    #: Seconds between SIGTERM and SIGKILL when the server is stopped.
    stop_timeout_s = 10.0

    def stop(self) -> None:
        """Terminate the subprocess (SIGTERM, then SIGKILL after :attr:`stop_timeout_s`)."""
        self.url = ""
        self.addresses = None
        if self._process is not None:
            self._process.stop(timeout_s=self.stop_timeout_s)

    def alive(self) -> bool:
        """Whether the subprocess runs and answers."""
        if self._process is None or not self._process.running():
            return False
        return self._is_live()

    def ensure_alive(self) -> None:
        """Restart the server when it died (or hangs), on the ports it had, and reload the last
        config pushed to it.

        Raises:
            TargetDiedError: The restarted server never became ready.
        """
        if self.alive():
            return
        ports, url, self.url, self.addresses = self.addresses, self.url, "", None
        self.restarts += 1
        self.notify(f"the server at {url or 'its address'} died or hangs: restarting it")
        process = self._supervisor()
        try:
            process.restart(timeout_s=self.stop_timeout_s, command=self._relaunch_command(ports))
            try:
                self._await_ready(process)
            except TargetError:
                if ports is None or process.running():
                    raise
                # Its old ports were taken meanwhile: free ones (a new url) beat no server.
                process.restart(timeout_s=self.stop_timeout_s, command=self._relaunch_command(None))
                self._await_ready(process)
            if self._last_config is not None:
                self.load_config(self._last_config)
        except TargetDiedError:
            raise
        except TargetError as exc:
            raise TargetDiedError(
                f"the server died and could not be restarted: {exc}", url
            ) from exc

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the running server's gRPC endpoint (``""`` when not running)."""
        return self.addresses.grpc_url if self.addresses is not None else ""

    def pid(self) -> int | None:
        """The server's process id (tests kill it to check the restart)."""
        return self._process.pid() if self._process else None

    def devices(self) -> list[dict[str, str]]:
        """What each instance of the model actually runs on (:func:`read_device_info`)."""
        return read_device_info(self.metrics_url, self.model, self.transport)

    def describe(self) -> dict[str, Any]:
        meta = self.server_metadata() if self.url else {}
        return {
            "kind": "managed",
            "managed_server": self.server_kind,
            "url": self.url,
            "device": self.device,
            "devices": self.devices() if self.url else [],
            "restarts": self.restarts,
            "server": meta.get("name"),
            "server_version": meta.get("version"),
            "log": str(self.log_path),
        }

    def __enter__(self) -> ManagedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------------
# Shared-target lease: two workers of one study must not tune the same server


#: Study user attributes that hold target leases start with this.
LEASE_PREFIX = "perfsweep.target_lease:"
#: A lease not renewed for this long belongs to a worker that is gone.
LEASE_TTL_S = 900.0


class TargetInUseError(TargetError):
    """Another live worker of the same study tunes the same server (``--url``) and model."""


class LeaseStore(Protocol):
    """Where leases live: the study's user attributes (:class:`analyzer.search.study.Search`)."""

    def study_attrs(self) -> dict[str, Any]:
        """Every study user attribute, read now."""
        ...

    def set_study_attr(self, key: str, value: Any) -> None:
        """Write one study user attribute."""
        ...


@dataclass(frozen=True)
class TargetLease:
    """One worker's claim on a server and model, kept in the study.

    Attributes:
        target: ``http://host:port`` of the server.
        model: The model tuned there.
        owner: This worker: ``host:pid:nonce``.
        host: The worker's host name.
        pid: The worker's process id.
        renewed_at: Unix time of the last renewal.
        released: The worker finished: the lease no longer counts.
    """

    target: str
    model: str
    owner: str
    host: str
    pid: int
    renewed_at: float
    released: bool = False

    @property
    def key(self) -> str:
        """Its study attribute: one per (target, model, owner), so claims never overwrite."""
        digest = hashlib.sha1(f"{self.target} {self.model}".encode()).hexdigest()[:12]
        return f"{LEASE_PREFIX}{digest}:{self.owner}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> TargetLease | None:
        """A lease from a study attribute; None for anything else."""
        try:
            return cls(**data)
        except TypeError:
            return None

    def live(self, now: float, ttl_s: float = LEASE_TTL_S) -> bool:
        """Not released, renewed within ``ttl_s``, and (on this host) its process still runs."""
        if self.released or now - self.renewed_at > ttl_s:
            return False
        return self.host != socket.gethostname() or _pid_running(self.pid)


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it runs
        return True
    return True


def new_lease(url: str, model: str, now: float) -> TargetLease:
    """This worker's lease on ``url``/``model`` (not yet written)."""
    host, pid = socket.gethostname(), os.getpid()
    return TargetLease(http_url(url), model, f"{host}:{pid}:{uuid.uuid4().hex[:8]}", host, pid, now)


def rival_leases(
    attrs: Mapping[str, Any], mine: TargetLease, now: float, ttl_s: float = LEASE_TTL_S
) -> list[TargetLease]:
    """The live leases of other workers on ``mine``'s server and model."""
    rivals = []
    for key, value in attrs.items():
        if not key.startswith(LEASE_PREFIX):
            continue
        lease = TargetLease.from_dict(value)
        if (
            lease is not None
            and lease.owner != mine.owner
            and (lease.target, lease.model) == (mine.target, mine.model)
            and lease.live(now, ttl_s)
        ):
            rivals.append(lease)
    return rivals


def claim_target(
    store: LeaseStore,
    url: str,
    model: str,
    now: float | None = None,
    ttl_s: float = LEASE_TTL_S,
) -> TargetLease:
    """Claim ``url``/``model`` for this worker in the study, or refuse.

    The claim is written first and the study read after it: of two workers that start together
    at least the later reader sees the other, so two never both go on (both may refuse: start
    them again one after the other). Renew the lease at least every ``ttl_s``
    (:func:`renew_target`) and release it at the end (:func:`release_target`).

    Raises:
        TargetInUseError: another live worker of this study tunes the same server and model;
            the message names it and what to do.
    """
    stamp = time.time() if now is None else now
    mine = new_lease(url, model, stamp)
    store.set_study_attr(mine.key, mine.to_dict())
    rivals = rival_leases(store.study_attrs(), mine, stamp, ttl_s)
    if rivals:
        release_target(store, mine)
        other = rivals[0]
        raise TargetInUseError(
            f"another perfsweep worker of this study (host {other.host}, pid {other.pid}, "
            f"renewed {max(0.0, stamp - other.renewed_at):.0f} s ago) tunes {model!r} on "
            f"{mine.target}: two workers would reload the model under each other. Give each "
            "worker its own server (--url, or a managed one), or start this one when it is done"
        )
    return mine


def renew_target(store: LeaseStore, lease: TargetLease, now: float | None = None) -> TargetLease:
    """The lease renewed (written to the study)."""
    renewed = dataclasses.replace(lease, renewed_at=time.time() if now is None else now)
    store.set_study_attr(renewed.key, renewed.to_dict())
    return renewed


def release_target(store: LeaseStore, lease: TargetLease) -> None:
    """Mark the lease released (study attributes cannot be deleted)."""
    store.set_study_attr(lease.key, dataclasses.replace(lease, released=True).to_dict())


@contextlib.contextmanager
def leased(store: LeaseStore, target: Target) -> Iterator[TargetLease | None]:
    """Hold the study's lease on ``target`` for the block, when it is shared (``--url``); a
    managed server is this worker's own (None). Released however the block ends (Ctrl-C too).

    Raises:
        TargetInUseError: another live worker of the study holds it (:func:`claim_target`).
    """
    if not target.shared:
        yield None
        return
    lease = claim_target(store, target.url, target.model)
    try:
        yield lease
    finally:
        release_target(store, lease)  # the key stays the same across renewals
