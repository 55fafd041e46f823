"""A real Triton Inference Server that perfsweep starts and manages (``--server triton``).

:class:`ManagedTriton` is :class:`analyzer.target.managed.ManagedServer` with a ``tritonserver``
process instead of the reference server: the same supervision (log in the run directory, dies
with perfsweep, a dead server is restarted and its trial retried), the same repository-API
config pushes. What differs is only how the process is prepared, launched and awaited:

* the binary: ``--triton-server-path``, else ``tritonserver`` on ``PATH``
  (:func:`find_tritonserver`; an :class:`~analyzer.errors.InputError` naming the flag when
  neither exists);
* the command line (:func:`triton_command`): loopback only, free ports picked just before each
  start (Triton cannot report a port 0 it bound), ``--model-control-mode=explicit`` on the
  user's repository, nothing loaded at startup;
* readiness: ``/v2/health/ready``, then the model is loaded explicitly
  (``POST /v2/repository/models/<m>/load``); an endpoint that could not bind (a port taken
  between picking and binding: Triton logs it and runs on) is a new start on new ports;
* the installation (:func:`triton_launch`): the ``tritonserver`` of the ``nvidia-pytriton``
  wheel needs a backend directory with the Python-backend stub beside ``libtriton_python.so``
  and a library path; a regular install (``/opt/tritonserver``) runs as it is.

The model's ``config.pbtxt`` in the user's repository is never written: every config perfsweep
tries is a ``load`` override (the JSON of a ``ModelConfig`` read back from this Triton).

No Docker: there is no container launcher; run the ``tritonserver`` binary.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import sys
import sysconfig
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.errors import InputError, TargetError
from analyzer.target.managed import ManagedServer
from analyzer.target.supervise import Supervisor, group_members
from analyzer.target.transport import Transport
from reference_server.ready import ServerAddresses

#: The flag that names the binary, in messages.
SERVER_PATH_FLAG = "--triton-server-path"
#: Starts tried when an endpoint could not bind its port (picked free a moment earlier).
PORT_ATTEMPTS = 3
#: Triton's log text of an endpoint that could not start (it keeps running without it).
_BIND_FAILED = "failed to start"
#: Shared-memory files of Triton's Python backend (one per stub process).
_SHM_PREFIX = "triton_python_backend_shm_region_"
_SHM_DIR = Path("/dev/shm")


class _PortTaken(Exception):
    """An endpoint of the starting Triton could not bind (start again on new ports)."""


def find_tritonserver(path: Path | None = None) -> Path:
    """The ``tritonserver`` binary to run: ``path``, else the one on ``PATH``.

    Raises:
        InputError: ``path`` is not an executable file, or there is none on ``PATH``; the
            message names ``--triton-server-path``.
    """
    if path is not None:
        binary = Path(path).expanduser().resolve()
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise InputError(
                f"{SERVER_PATH_FLAG} {path}: no executable tritonserver there; give the path of "
                "the binary (e.g. /opt/tritonserver/bin/tritonserver)"
            )
        return binary
    found = shutil.which("tritonserver")
    if found is None:
        raise InputError(
            "--server triton: no tritonserver on PATH; pass "
            f"{SERVER_PATH_FLAG} /path/to/tritonserver (a Triton install, or the one in the "
            "nvidia-pytriton wheel: <site-packages>/pytriton/tritonserver/bin/tritonserver)"
        )
    return Path(found).resolve()


# --------------------------------------------------------------------------------------------
# The installation


@dataclass(frozen=True)
class TritonLaunch:
    """What a ``tritonserver`` binary needs to run from this process.

    Attributes:
        binary: The executable.
        backend_directory: ``--backend-directory`` (None: the binary's own default).
        env: Environment variables set for it (on top of this process's).
    """

    binary: Path
    backend_directory: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)


def triton_launch(
    binary: Path, workdir: Path, base_env: Mapping[str, str] | None = None
) -> TritonLaunch:
    """How to run ``binary``; a wheel's Triton gets its backends assembled under ``workdir``.

    The ``nvidia-pytriton`` wheel keeps the Python backend's stub apart from
    ``libtriton_python.so`` (``tritonserver/python_backend_stubs/<X.Y>/``), and the backend
    looks for it beside itself: the backends are copied to ``workdir/backends`` with the stub of
    this interpreter's version (the stub runs the models with this Python). The stub links
    ``libpython3.X.so``: this interpreter's ``LIBDIR`` goes first on ``LD_LIBRARY_PATH`` (a
    system libpython of another patch release breaks every model), then the wheel's vendored
    libraries; the site directory that holds numpy goes on ``PYTHONPATH`` (the backend's
    utilities import it). A Triton that is not the wheel's runs as installed, with
    ``<root>/backends`` beside ``<root>/bin`` when there is one.

    Raises:
        InputError: the wheel has no stub for this Python version.
    """
    env_in = dict(os.environ if base_env is None else base_env)
    root = binary.resolve().parent.parent
    stubs = root / "python_backend_stubs"
    if not stubs.is_dir():
        backends = root / "backends"
        return TritonLaunch(binary, backends if backends.is_dir() else None)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = stubs / version / "triton_python_backend_stub"
    if not stub.is_file():
        have = sorted(p.name for p in stubs.iterdir() if p.is_dir())
        raise InputError(
            f"{binary}: this Triton has Python-backend stubs for {', '.join(have) or 'none'}, "
            f"not for Python {version}; run perfsweep with one of those"
        )
    dest = Path(workdir) / "backends"
    if not (dest / "python" / stub.name).is_file():
        shutil.copytree(
            root / "backends",
            dest,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        shutil.copy2(stub, dest / "python" / stub.name)
    lib_dirs = [
        sysconfig.get_config_var("LIBDIR") or "",
        str(root.parent.parent / "nvidia_pytriton.libs"),
    ]
    python_paths = [_site_of("numpy")]
    env = {
        "LD_LIBRARY_PATH": _joined(lib_dirs, env_in.get("LD_LIBRARY_PATH")),
        "PYTHONPATH": _joined(python_paths, env_in.get("PYTHONPATH")),
    }
    return TritonLaunch(binary, dest, env)


def _site_of(module: str) -> str:
    """The directory a module is imported from (found, not imported); ``""`` when absent."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return ""
    return str(Path(spec.origin).resolve().parent.parent)


def _joined(first: list[str], rest: str | None) -> str:
    return os.pathsep.join(p for p in [*first, rest or ""] if p)


@dataclass(frozen=True)
class TritonPorts:
    """The three ports one start of Triton binds on 127.0.0.1."""

    http: int
    grpc: int
    metrics: int

    def addresses(self) -> ServerAddresses:
        """As the reference server's ready line would give them."""
        return ServerAddresses("127.0.0.1", self.http, self.grpc, self.metrics)


def free_ports(count: int = 3) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago (a start that loses
    one to another process is retried on new ones)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):  # held open together, so the ports differ
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def triton_command(
    launch: TritonLaunch, repository: Path, ports: TritonPorts, exit_timeout_s: int = 10
) -> list[str]:
    """The ``tritonserver`` command line: loopback, ``ports``, explicit model control on
    ``repository``, no model loaded at startup (perfsweep loads the one it tunes)."""
    args = [
        str(launch.binary),
        f"--model-repository={repository}",
        "--model-control-mode=explicit",
        f"--http-port={ports.http}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-port={ports.metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        f"--exit-timeout-secs={exit_timeout_s}",
    ]
    if launch.backend_directory is not None:
        args.append(f"--backend-directory={launch.backend_directory}")
    return args


def bind_failure(log_text: str) -> str | None:
    """The log line of an endpoint that could not start, or None."""
    failed = [line for line in log_text.splitlines() if _BIND_FAILED in line.lower()]
    return failed[-1].strip() if failed else None


def shm_regions(pgid: int) -> set[Path]:
    """Python-backend shared-memory files mapped by the live processes of group ``pgid``.

    Triton removes them when it unloads a model; a Triton that was killed cannot, so they are
    noted while it runs and removed once its group is gone (:meth:`ManagedTriton.stop`).
    """
    regions: set[Path] = set()
    for pid in group_members(pgid):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    path = line.rsplit(maxsplit=1)[-1]
                    if Path(path).name.startswith(_SHM_PREFIX):
                        regions.add(Path(path))
            # A stub names its region on its command line, before it maps it.
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                for arg in cmdline.read().decode(errors="replace").split("\0"):
                    if arg.startswith(_SHM_PREFIX):
                        regions.add(_SHM_DIR / arg)
        except OSError:  # it ended meanwhile
            continue
    return regions


# --------------------------------------------------------------------------------------------
# The target


class ManagedTriton(ManagedServer):
    """A ``tritonserver`` on 127.0.0.1 that perfsweep starts, restarts and stops.

    Args:
        model: The model to tune, in ``repository``.
        repository: The user's model repository (served as it is; never written).
        log_path: The server's stdout and stderr (appended on restart); the backends of a wheel
            Triton are assembled beside it.
        binary: ``tritonserver`` (None: found on ``PATH``, see :func:`find_tritonserver`).
        startup_timeout_s: How long to wait for the server to be ready and the model loaded.
        transport: The HTTP seam (default: urllib).

    Raises:
        InputError: (at construction) no binary, or no repository.
    """

    server_name = "Triton"
    server_kind = "triton"
    stop_timeout_s = 15.0

    def __init__(
        self,
        model: str,
        repository: Path | None,
        log_path: Path,
        binary: Path | None = None,
        startup_timeout_s: float = 180.0,
        transport: Transport | None = None,
        also_load: Sequence[str] = (),
    ) -> None:
        if repository is None:
            raise InputError(
                "--server triton serves your own model repository: pass --model-repository DIR "
                "(the bundled models run on the reference server)"
            )
        super().__init__(
            model,
            "triton",
            log_path,
            repository=repository,
            startup_timeout_s=startup_timeout_s,
            transport=transport,
        )
        self.binary = find_tritonserver(binary)
        #: Models loaded before :attr:`model`: a BLS model's composing models, which Triton
        #: cannot find in its code (an ensemble's are loaded with it).
        self.also_load = tuple(also_load)
        self.ports: TritonPorts | None = None
        self._launch: TritonLaunch | None = None
        #: Shared-memory files seen mapped, by the process group that mapped them.
        self._regions: dict[int, set[Path]] = {}
        self._regions_lock = threading.Lock()

    # -- hooks of ManagedServer ----------------------------------------------------------------

    def _prepare(self) -> None:
        if self._launch is None:
            self._launch = triton_launch(self.binary, self.log_path.parent)

    def command(self, ports: ServerAddresses | None = None) -> list[str]:
        """The ``tritonserver`` command line of the next start: on ``ports`` (a restart), else
        on new free ones."""
        self._prepare()
        assert self._launch is not None and self.repository is not None
        if ports is not None:
            self.ports = TritonPorts(ports.http_port, ports.grpc_port, ports.metrics_port)
        else:
            http, grpc, metrics = free_ports(3)
            self.ports = TritonPorts(http, grpc, metrics)
        return triton_command(self._launch, self.repository, self.ports)

    def _new_supervisor(self) -> Supervisor:
        assert self._launch is not None
        return Supervisor(
            self.command(),
            self.log_path,
            name=self.server_name,
            label="server",
            env=dict(self._launch.env),
            own_group=True,  # its stub processes go with it
            before_group_end=self._note_group_regions,  # theirs, as the stubs end with it
        )

    def _await_ready(self, process: Supervisor) -> None:
        """Wait for ``/v2/health/ready`` (new ports when one could not bind), then load the model."""
        self._drop_regions()  # a restart: the old group is gone now
        for attempt in range(1, PORT_ATTEMPTS + 1):
            assert self.ports is not None
            self.addresses = self.ports.addresses()
            self.url = f"http://{self.addresses.http_url}"
            self.metrics_url = self.addresses.metrics_url
            try:
                process.wait_for(self._ready_probe, self.startup_timeout_s)
                break
            except (_PortTaken, TargetError) as exc:
                # Triton 2.51 exits when its HTTP or gRPC port is taken; an endpoint that fails
                # otherwise may leave it running. Either way the log line says so.
                failed = bind_failure(process.log_text())
                if failed is None:
                    raise
                if attempt == PORT_ATTEMPTS:
                    process.stop(self.stop_timeout_s)
                    raise TargetError(
                        f"Triton could not bind its ports {PORT_ATTEMPTS} times ({failed}); "
                        f"log: {self.log_path}"
                    ) from exc
                process.note(f"{failed}; starting again on new ports")
                process.stop(self.stop_timeout_s)
                process.command = self.command()
                process.start()
        self._load_model(process)

    def _ready_probe(self, log_text: str) -> bool | None:
        """:meth:`Supervisor.wait_for`'s parser: True once the server answers ready."""
        failed = bind_failure(log_text)
        if failed is not None:
            raise _PortTaken(failed)
        try:
            status, _ = self._get("/v2/health/ready", timeout_s=2.0)
        except OSError:
            return None
        return True if status == 200 else None

    def _load_model(self, process: Supervisor) -> None:
        """Load the model (after :attr:`also_load`) from the repository as it is (explicit
        model control)."""
        for name in (*self.also_load, self.model):
            self._load_one(name, process)

    def _load_one(self, name: str, process: Supervisor) -> None:
        path = f"/v2/repository/models/{name}/load"
        try:
            with self._watching_regions():
                status, payload = self._call("POST", path, {}, timeout_s=self.startup_timeout_s)
        except OSError as exc:
            raise TargetError(
                f"Triton stopped answering while loading {name!r}: {exc} (log: {self.log_path})"
            ) from exc
        if status != 200:
            error = payload.get("error") if isinstance(payload, dict) else payload
            raise TargetError(
                f"Triton could not load model {name!r} from {self.repository}: {error} "
                f"(log: {self.log_path})"
            )
        deadline = self.clock() + self.startup_timeout_s
        while not self._is_ready(name):
            if not process.running() or self.clock() > deadline:
                raise TargetError(f"model {name!r} never became ready (log: {self.log_path})")
            self.sleep(0.2)

    # -- life cycle additions ------------------------------------------------------------------

    def load_config(
        self,
        config: mc.ModelConfig,
        *,
        wait_for_model: bool = True,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        with self._watching_regions():  # a reload starts new stubs with new regions
            super().load_config(config, wait_for_model=wait_for_model, files=files)

    def stop(self) -> None:
        """Stop Triton (SIGTERM: it unloads its models), end its stubs, remove what they left."""
        super().stop()
        self._drop_regions()

    def devices(self) -> list[dict[str, str]]:
        """Triton reports no per-instance device metric: its instance groups say where it runs."""
        return []

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["binary"] = str(self.binary)
        return info

    @contextlib.contextmanager
    def _watching_regions(self, poll_s: float = 0.05) -> Iterator[None]:
        """Note the group's shared-memory regions while a load runs, and once it is done.

        Triton creates a new instance's region before it starts the stub that maps it; killed
        in between, it leaves a file that only a look during the load can find.
        """
        done = threading.Event()

        def watch() -> None:
            while not done.wait(poll_s):
                self._note_regions()

        watcher = threading.Thread(target=watch, name="shm-regions", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()
            self._note_regions()

    def _note_regions(self) -> None:
        pid = self.pid()  # the group leader: its pid is the group's id
        if pid is not None:
            self._note_group_regions(pid)

    def _note_group_regions(self, pgid: int) -> None:
        """Note the regions group ``pgid`` maps (also from the supervisor's waiting thread, when
        Triton died: a load under way has a region no finished load noted)."""
        found = shm_regions(pgid)
        with self._regions_lock:
            self._regions.setdefault(pgid, set()).update(found)

    def _drop_regions(self) -> None:
        """Remove the noted shared-memory files of every group of which nothing runs any more."""
        with self._regions_lock:
            gone = [g for g in self._regions if not group_members(g)]
            regions = [r for g in gone for r in self._regions.pop(g)]
        for region in regions:
            with contextlib.suppress(OSError):
                region.unlink()


def managed_triton(
    model: str,
    repository: Path | None,
    workdir: Path,
    binary: Path | None,
    startup_timeout_s: float,
    transport: Transport | None = None,
    also_load: Sequence[str] = (),
) -> ManagedTriton:
    """The managed Triton of a run directory ``workdir``: log ``workdir/server/tritonserver.log``.

    Raises:
        InputError: No binary, or no repository.
    """
    return ManagedTriton(
        model,
        repository,
        Path(workdir) / "server" / "tritonserver.log",
        binary=binary,
        startup_timeout_s=startup_timeout_s,
        transport=transport,
        also_load=also_load,
    )
