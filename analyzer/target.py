"""The server under test, behind one protocol.

Two implementations:

* :class:`ManagedServer`: the reference server as a subprocess (``python -m reference_server``)
  on loopback with free ports, its output appended to a log file in the run directory; it is
  restarted when it dies.
* :class:`RemoteTarget`: a server that is already running at ``--url`` (a real Triton or a
  reference server); never restarted.

Both push a config the same way Triton's Model Analyzer does in remote mode, without a
restart: ``POST /v2/repository/models/<m>/load`` with ``{"parameters": {"config": <JSON>}}``,
then wait until the model is ready. Only plain HTTP (urllib) is used here, so no gevent or
tritonclient import is needed to manage a target.

A managed server dies with the process that started it, even after ``kill -9`` of that process:
on Linux the child asks for ``PR_SET_PDEATHSIG`` (SIGTERM when its parent thread exits) before
it executes, and everywhere the server gets ``PERFSWEEP_PARENT_PID`` and stops itself once its
parent is gone (a watchdog in ``python -m reference_server``). :func:`die_with_parent` is the one
mechanism; ``perfsweep run``, ``gate`` and ``ui`` all start their servers through
:class:`ManagedServer`.

Only ``http://`` URLs are accepted (:func:`http_url`, the one place URLs enter): TLS is not
implemented end to end, so an ``https://`` URL is refused rather than sent as plain HTTP.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.errors import InputError, TargetError
from reference_server.ready import last_ready

#: Environment variable naming the pid a managed server must outlive no longer than it.
PARENT_PID_ENV = "PERFSWEEP_PARENT_PID"

_PR_SET_PDEATHSIG = 1


class ConfigRejectedError(TargetError):
    """The server refused a config (the trial fails; the sweep goes on)."""


def http_url(url: str) -> str:
    """``url`` as ``http://host:port`` (a bare ``host:port`` gets ``http://``; no trailing /).

    Raises:
        InputError: ``https://`` (TLS is not supported: refused, never sent as plain HTTP) or
            another scheme.
    """
    text = url.strip().rstrip("/")
    scheme, sep, rest = text.partition("://")
    if not sep:
        return f"http://{text}"
    if scheme.lower() == "https":
        raise InputError(
            f"{url!r}: https:// is not supported (perfsweep speaks plain HTTP only); "
            "use the server's http:// address, or put a local TLS-terminating proxy in front"
        )
    if scheme.lower() != "http":
        raise InputError(f"{url!r}: the URL must start with http://")
    return f"http://{rest}"


def untunable_reason(config: mc.ModelConfig) -> str | None:
    """Why perfsweep must not tune this model, or None.

    ``dynamic_batching``, ``sequence_batching`` and ``ensemble_scheduling`` share one proto
    ``oneof``: setting the first erases the others, which would silently change what an ensemble
    or a stateful model means.
    """
    kind = config.WhichOneof("scheduling_choice")
    what = ""
    if config.platform == "ensemble" or kind == "ensemble_scheduling":
        what = 'an ensemble (platform "ensemble" / ensemble_scheduling)'
    elif kind == "sequence_batching":
        what = "sequence-batched (sequence_batching: a stateful model)"
    if not what:
        return None
    return (
        f"model {config.name!r} is {what}; perfsweep tunes dynamic_batching, which would erase "
        "that scheduling (one proto oneof). Tune the ensemble's composing models, or a "
        "stateless model with dynamic batching, instead"
    )


def die_with_parent(parent_pid: int) -> None:
    """``preexec_fn`` of a managed child: SIGTERM when the parent thread dies (Linux).

    Runs in the child between fork and exec. When the parent already died in between, the
    child exits at once. Elsewhere this does nothing; the server's own watchdog
    (``PERFSWEEP_PARENT_PID``) covers it.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def child_process_options(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``subprocess.Popen`` keyword arguments that tie a child's life to this process.

    Args:
        env: The child's environment (default: this process's); the parent pid is added.
    """
    parent = os.getpid()
    return {
        "preexec_fn": lambda: die_with_parent(parent),
        "env": {**(os.environ if env is None else env), PARENT_PID_ENV: str(parent)},
    }


class Target(Protocol):
    """The server under test.

    Attributes:
        model: The model being tuned.
        url: Base HTTP URL (``http://host:port``).
        device: ``sim``, ``cpu``, ``cuda`` for a managed server; ``remote`` otherwise.
        shared: The server outlives the sweep (``--url``): the sweep must leave it on a
            known config. A managed server is stopped instead.
    """

    model: str
    url: str
    device: str
    shared: bool

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
        """Restart a dead managed server (raise :class:`TargetError` when that is impossible)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts for the summary: kind, url, device, server version."""
        ...


# --------------------------------------------------------------------------------------------------
# HTTP helpers


def http_json(
    method: str, url: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0
) -> tuple[int, Any]:
    """One HTTP request with a JSON body; returns (status, decoded JSON or text)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


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


_DEVICE_INFO = re.compile(r"^perfsweep_model_device_info\{([^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_device_info(metrics_text: str, model: str) -> list[dict[str, str]]:
    """The ``perfsweep_model_device_info`` series of ``model`` as label dicts (one per instance)."""
    found = []
    for match in _DEVICE_INFO.finditer(metrics_text):
        labels = dict(_LABEL.findall(match.group(1)))
        if labels.get("model") == model:
            found.append(labels)
    return found


def observed_device(devices: list[dict[str, str]], requested: str) -> str:
    """``sim``, ``cuda`` or ``cpu`` as the server reports it; ``requested`` when unknown."""
    if not devices:
        return requested
    if all(d.get("backend") == "simulated" for d in devices):
        return "sim"
    kinds = {d.get("device", "") for d in devices}
    return "cuda" if "cuda" in kinds else (kinds.pop() if len(kinds) == 1 else requested)


class _HttpTarget:
    """What both targets share: the KServe v2 HTTP calls."""

    model: str
    url: str
    load_timeout_s: float = 300.0

    def _get(self, path: str, timeout_s: float = 10.0) -> tuple[int, Any]:
        return http_json("GET", self.url + path, timeout_s=timeout_s)

    def _is_live(self) -> bool:
        try:
            status, _ = self._get("/v2/health/live", timeout_s=5.0)
        except OSError:
            return False
        return status == 200

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
        url = f"{self.url}/v2/repository/models/{self.model}/load"
        try:
            status, payload = http_json("POST", url, body, timeout_s=self.load_timeout_s)
        except OSError as exc:
            raise TargetError(f"loading a config into {self.url} failed: {exc}") from exc
        if status != 200:
            # A server that still answers refused this config (Triton reports a refused override
            # as 400 or as a 500 "failed to load"): the trial fails, the sweep goes on. A server
            # that went away is a target failure (restart and retry).
            if self._is_live():
                raise ConfigRejectedError(
                    f"the server refused the config ({status}): {_error_text(payload)}"
                )
            raise TargetError(f"load of {self.model} failed ({status}): {_error_text(payload)}")
        deadline = time.monotonic() + self.load_timeout_s
        while not self._is_ready():
            if time.monotonic() > deadline:
                raise TargetError(
                    f"{self.model} was not ready {self.load_timeout_s:.0f} s after load"
                )
            time.sleep(0.1)

    def server_metadata(self) -> dict[str, Any]:
        try:
            status, payload = self._get("/v2")
        except OSError:
            return {}
        return payload if status == 200 and isinstance(payload, dict) else {}


# --------------------------------------------------------------------------------------------------
# Remote


class RemoteTarget(_HttpTarget):
    """A running server at ``url`` (real Triton in explicit model-control mode, or ours)."""

    shared = True

    def __init__(self, url: str, model: str, timeout_s: float = 10.0) -> None:
        self.url = http_url(url)
        self.model = model
        self.device = "remote"
        self.timeout_s = timeout_s

    def start(self) -> None:
        """Check that the server answers and the model is ready."""
        deadline = time.monotonic() + self.timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                status, _ = self._get("/v2/health/ready", timeout_s=2.0)
                if status == 200:
                    break
                last = f"HTTP {status}"
            except OSError as exc:
                last = str(getattr(exc, "reason", exc))
            time.sleep(0.2)
        else:
            raise TargetError(f"cannot reach the server at {self.url} ({last}); check --url")
        if not self._is_ready():
            raise TargetError(
                f"model {self.model!r} is not ready on {self.url}; load it first "
                "(the server must run with --model-control-mode=explicit for perfsweep to reload it)"
            )

    def stop(self) -> None:
        """Nothing to stop: the server belongs to someone else."""

    def ensure_alive(self) -> None:
        """Raise when the remote server stopped answering (it cannot be restarted from here)."""
        try:
            status, _ = self._get("/v2/health/live", timeout_s=5.0)
        except OSError as exc:
            raise TargetError(f"the server at {self.url} stopped answering: {exc}") from exc
        if status != 200:
            raise TargetError(f"the server at {self.url} is not live (HTTP {status})")

    def describe(self) -> dict[str, Any]:
        meta = self.server_metadata()
        return {
            "kind": "remote",
            "url": self.url,
            "device": self.device,
            "server": meta.get("name"),
            "server_version": meta.get("version"),
        }


# --------------------------------------------------------------------------------------------------
# Managed reference server


class ManagedServer(_HttpTarget):
    """The reference server as a subprocess on loopback with free ports.

    Args:
        model: Model to load (a bundled model name, or a model in ``repository``).
        device: ``auto``, ``cpu``, ``cuda`` or ``sim``.
        log_path: File that receives the server's stdout and stderr (appended on restart).
        repository: Model repository directory; None for a bundled model.
        startup_timeout_s: How long to wait for the ready line and the model.
        python: Interpreter to run the server with.
    """

    shared = False

    def __init__(
        self,
        model: str,
        device: str,
        log_path: Path,
        repository: Path | None = None,
        startup_timeout_s: float = 180.0,
        python: str = sys.executable,
    ) -> None:
        self.model = model
        self.device = device
        # Absolute paths: the server and the repository writer run in other working directories.
        self.log_path = Path(log_path).resolve()
        self.repository = Path(repository).resolve() if repository is not None else None
        self.startup_timeout_s = startup_timeout_s
        self.python = python
        self.url = ""
        self.metrics_url = ""
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._last_config: mc.ModelConfig | None = None

    def command(self) -> list[str]:
        """The server's command line."""
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
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
        ]
        if self.repository is not None:
            cmd += ["--model-repository", str(self.repository)]
        return cmd

    def _bundled_repository(self) -> Path:
        """Materialise a bundled model's repository beside the log (in a child process, so
        this process never imports the server package)."""
        root = self.log_path.parent / "repository"
        if not (root / self.model / "config.pbtxt").exists():
            code = (
                "import sys; from pathlib import Path; "
                "from reference_server.zoo.resnet50 import MODEL_NAME, make_repository; "
                "assert sys.argv[1] == MODEL_NAME, 'not a bundled model: ' + sys.argv[1]; "
                "make_repository(Path(sys.argv[2]), sys.argv[3])"
            )
            done = subprocess.run(
                [self.python, "-c", code, self.model, str(root), self.device],
                capture_output=True,
                text=True,
                timeout=self.startup_timeout_s,
                cwd=self.log_path.parent,
            )
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise TargetError(
                    f"cannot prepare the bundled model {self.model!r}: {tail}; "
                    "pass --model-repository DIR for your own models"
                )
        return root

    def start(self) -> None:
        """Start the subprocess, read its ports from the log, wait until the model is ready."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.repository is None:
            self.repository = self._bundled_repository()
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            log.write(f"--- perfsweep: starting {' '.join(self.command())}\n".encode())
            log.flush()
            options = child_process_options()  # dies with this process, even on kill -9
            options["env"]["PYTHONUNBUFFERED"] = "1"
            self._proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                **options,
            )
            log.write(f"--- perfsweep: server pid {self._proc.pid}\n".encode())
            log.flush()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.url:
            if self._proc.poll() is not None:
                raise TargetError(
                    f"the reference server exited with status {self._proc.returncode} during "
                    f"startup: {self._log_tail(offset)} (full log: {self.log_path})"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TargetError(
                    f"the reference server did not start within {self.startup_timeout_s:.0f} s "
                    f"(log: {self.log_path})"
                )
            addresses = last_ready(self._log_text(offset))
            if addresses is not None:
                self.url = f"http://{addresses.http_url}"
                self.metrics_url = addresses.metrics_url
            else:
                time.sleep(0.1)
        while not self._is_ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise TargetError(f"model {self.model!r} never became ready (log: {self.log_path})")
            time.sleep(0.2)

    def stop(self) -> None:
        """Terminate the subprocess (SIGTERM, then SIGKILL after 10 s)."""
        proc, self._proc = self._proc, None
        self.url = ""
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def alive(self) -> bool:
        """Whether the subprocess runs and answers."""
        if self._proc is None or self._proc.poll() is not None:
            return False
        try:
            status, _ = self._get("/v2/health/live", timeout_s=5.0)
        except OSError:
            return False
        return status == 200

    def ensure_alive(self) -> None:
        """Restart the server when it died, and reload the last config pushed to it."""
        if self.alive():
            return
        code = self._proc.poll() if self._proc else None
        self.stop()
        with open(self.log_path, "ab") as log:
            log.write(f"--- perfsweep: server died (status {code}); restarting\n".encode())
        self.restarts += 1
        self.start()
        if self._last_config is not None:
            super().load_config(self._last_config)

    def load_config(self, config: mc.ModelConfig) -> None:
        super().load_config(config)
        self._last_config = config

    def pid(self) -> int | None:
        """The server's process id (tests kill it to check the restart)."""
        return self._proc.pid if self._proc else None

    def devices(self) -> list[dict[str, str]]:
        """What each instance of the model actually runs on, as the server reports it.

        Read from the reference server's ``perfsweep_model_device_info`` metric (backend,
        device, execution provider or simulated profile); empty when it cannot be read.
        """
        if not self.metrics_url:
            return []
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5.0) as response:
                text = response.read().decode("utf-8", errors="replace")
        except OSError:
            return []
        return parse_device_info(text, self.model)

    def describe(self) -> dict[str, Any]:
        meta = self.server_metadata() if self.url else {}
        return {
            "kind": "managed",
            "url": self.url,
            "device": self.device,
            "devices": self.devices() if self.url else [],
            "restarts": self.restarts,
            "server": meta.get("name"),
            "server_version": meta.get("version"),
            "log": str(self.log_path),
        }

    def _log_text(self, offset: int) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def _log_tail(self, offset: int) -> str:
        lines = [line for line in self._log_text(offset).splitlines() if line.strip()]
        return lines[-1] if lines else "no output"

    def __enter__(self) -> ManagedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
