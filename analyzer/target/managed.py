"""A server process perfsweep starts and restarts: the managed implementation of the target.

:class:`ManagedServer`: a server process perfsweep starts on loopback with free ports, its
output appended to a log file in the run directory; it is restarted when it dies. The
reference server (``python -m reference_server``) by default;
:class:`analyzer.target.triton.ManagedTriton` is the same target with a real ``tritonserver``
(``--server triton``): it only overrides how the process is prepared, launched and awaited.
The other implementation, a server already running at ``--url``, is
:class:`analyzer.target.remote.RemoteTarget`; both push a config the same way
(:mod:`analyzer.target.protocol`, with the :class:`~analyzer.target.protocol.Target` protocol),
and a ``--url`` server shared by several workers is leased (:mod:`analyzer.target.leases`).

Jobs are split: :mod:`analyzer.target.supervise` runs the server process (dies with this process,
log file, wait for the ready line, SIGTERM then SIGKILL); :mod:`analyzer.target.transport` carries
the HTTP calls (a ``MockTransport`` in tests); :func:`bundled_repository` writes a bundled model's
repository; :func:`~analyzer.target.protocol.read_device_info` scrapes what each instance runs on.
:class:`ManagedServer` composes them. :func:`analyzer.target.factory.make_target` picks the target
a scenario describes (sweep and gate alike); it sits above this module and
:mod:`analyzer.target.triton`, which builds on :class:`ManagedServer`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analyzer.errors import TargetDiedError, TargetError
from analyzer.target.protocol import _HttpTarget, read_device_info
from analyzer.target.supervise import Supervisor
from analyzer.target.transport import Transport, UrllibTransport
from reference_server.ready import ServerAddresses, last_ready

#: How a child process writes each bundled model's repository (``MODEL ROOT DEVICE`` follow):
#: the zoo's resnet50 module, or the accumulator's ``make_repository``. Unknown models go to
#: the resnet50 writer, which says that they are not bundled.
_BUNDLED_WRITERS: dict[str, list[str]] = {
    "resnet50": ["-m", "reference_server.zoo.resnet50"],
    "tinyllm": ["-m", "reference_server.zoo.tinyllm"],
    "accumulator": [
        "-c",
        "import sys; from pathlib import Path; "
        "from reference_server.zoo.accumulator import make_repository; "
        "make_repository(Path(sys.argv[2]))",
    ],
}

#: Bundled models that run only on the simulated device (their backend is a simulation).
_SIM_ONLY = frozenset({"accumulator", "tinyllm"})


def bundled_repository(
    model: str, root: Path, device: str, python: str = sys.executable, timeout_s: float = 180.0
) -> Path:
    """Write the repository of bundled model ``model`` under ``root`` (kept when already there).

    The bundled models are ``resnet50``, the stateful ``accumulator``
    (:mod:`reference_server.zoo.accumulator`, sequence batching with the oldest strategy, on the
    simulated device only) and the generative ``tinyllm`` (:mod:`reference_server.zoo.tinyllm`,
    the reference engine, simulated device only). Runs the zoo in a child process (``python -m
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

    Composes a :class:`~analyzer.target.supervise.Supervisor` (the process and its log), the ready
    line (:func:`reference_server.ready.last_ready`), :func:`bundled_repository` and
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
        also_load: More models to load at startup (a mix of models served together).
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
        also_load: Sequence[str] = (),
    ) -> None:
        self.model = model
        self.also_load = tuple(also_load)
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
        for other in self.also_load:
            cmd += ["--model", other]
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
            self.reload_last()
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
