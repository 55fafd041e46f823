"""A real NVIDIA Triton Inference Server for tests and benchmarks.

The PyPI wheel ``nvidia-pytriton`` ships a complete ``tritonserver`` binary with the Python
backend (see ``/work/shared/notes/real-triton.md``). This module turns it into something a test
can start in a second: it finds the binary, assembles a writable backend directory with the stub
for the running Python, writes Python-backend model repositories from code, and runs the server
on loopback with free ports in explicit model-control mode.

Typical use (pytest: the ``real_triton`` fixture in ``tests/conftest.py`` does this)::

    install = TritonInstall.locate()          # raises TritonUnavailable with a reason
    with RealTriton(install, workdir) as triton:
        triton.add_model(sleep_model_config("m", execute_delay_ms=50, max_batch_size=8,
                                            dynamic_batching=dynamic_batching(preferred=[4])))
        triton.load_model("m")
        client = tritonclient.http.InferenceServerClient(triton.http_url)
        ...

Every model written here is the same ``model.py`` (``SLEEP_MODEL_SOURCE``): it returns input
``k`` as output ``k`` and, like the ``execute_delay_ms`` models of Triton's own qa tests, sleeps
``execute_delay_ms`` per execution plus ``execute_delay_ms_per_item`` per batch item (the sum of
the requests' batch sizes), both read from the config ``parameters`` -- the same knobs as the
reference server's ``identity`` backend, so one config drives both servers.

``TRITONSERVER_DELAY_SCHEDULER=N`` (``RealTriton(delay_scheduler=N)``) makes batch formation
deterministic: each dynamic batcher holds its queue until N requests are queued. It is read when
a model's batcher thread starts, i.e. once per (re)load of a model, and applies to every model of
that server, so scenarios needing different N need different servers.

Caveat: the wheel's stub is built against numpy 1. With numpy 2 (this project's), building an
output with ``pb_utils.Tensor(name, ndarray)`` yields zeros and BYTES inputs crash the stub, so
the model hands outputs over with DLPack and :func:`sleep_model_config` refuses BYTES. The stub
ignores ``PYTHONPATH``, but its ``sys.path`` starts with its working directory: a server started
with ``cwd`` holding numpy 1 (``tests/support/stream_model.py``'s ``stub_numpy1``) gives its
models working BYTES tensors.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.target.supervise import kill_group
from tests.support.servers import ServerHandle, free_port, http_request, write_model

__all__ = [
    "SLEEP_MODEL_SOURCE",
    "RealTriton",
    "TensorSpec",
    "TritonInstall",
    "TritonStartError",
    "TritonUnavailable",
    "dynamic_batching",
    "free_port",
    "identity_model_config",
    "sleep_model_config",
]

PYTRITON_VERSION = "0.7.0"
#: Log text of an endpoint that could not bind; Triton logs it and keeps running.
_BIND_FAILED = "failed to start"


class TritonUnavailable(RuntimeError):
    """The real Triton cannot run here; ``str(exc)`` is the reason a test shows when skipping."""


class TritonStartError(RuntimeError):
    """The server process was started but did not become ready; the message holds its log tail."""


# --------------------------------------------------------------------------------------------
# Locating the installation


@dataclass(frozen=True)
class TritonInstall:
    """Paths of the Triton pieces inside the installed ``pytriton`` package.

    Attributes:
        server_bin: the ``tritonserver`` executable.
        python_backend_dir: ``backends/python`` (``libtriton_python.so`` and its utils module).
        stub: ``triton_python_backend_stub`` built for the running Python version.
        libs_dir: ``nvidia_pytriton.libs`` (shared libraries the wheel vendors).
    """

    server_bin: Path
    python_backend_dir: Path
    stub: Path
    libs_dir: Path

    @classmethod
    def locate(cls) -> TritonInstall:
        """Find the binary in the installed ``nvidia-pytriton`` wheel.

        Raises:
            TritonUnavailable: not Linux x86_64, the wheel is not installed, or it lacks a piece.
        """
        if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
            raise TritonUnavailable(
                f"real Triton needs Linux x86_64 (nvidia-pytriton wheel); this is "
                f"{sys.platform}/{platform.machine()}"
            )
        # find_spec, not import: pytriton's own Python side needs deps installed --no-deps skips.
        spec = importlib.util.find_spec("pytriton")
        if spec is None or spec.origin is None:
            raise TritonUnavailable(
                "nvidia-pytriton is not installed: "
                f"pip install --no-deps nvidia-pytriton=={PYTRITON_VERSION}"
            )
        root = Path(spec.origin).resolve().parent / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        install = cls(
            server_bin=root / "bin" / "tritonserver",
            python_backend_dir=root / "backends" / "python",
            stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
            libs_dir=root.parent.parent / "nvidia_pytriton.libs",
        )
        for path in (install.server_bin, install.python_backend_dir, install.stub):
            if not path.exists():
                raise TritonUnavailable(f"nvidia-pytriton install is incomplete: {path} missing")
        return install

    def prepare_backends(self, dest: Path) -> Path:
        """Assemble a writable ``--backend-directory`` under ``dest``.

        The wheel keeps the stubs apart from ``libtriton_python.so``; the backend looks for the
        stub beside itself, so both are copied into ``dest/python``.

        Returns:
            ``dest``, to pass as ``--backend-directory``.
        """
        python_dir = dest / "python"
        if not (python_dir / "triton_python_backend_stub").exists():
            shutil.copytree(
                self.python_backend_dir,
                python_dir,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("__pycache__"),
            )
            shutil.copy2(self.stub, python_dir / "triton_python_backend_stub")
        return dest

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment the server and its stub processes need.

        The stub links ``libpython3.X.so``; a system libpython of another patch release would be
        picked up first and break every model (``_thread.RLock`` has no ``_recursion_count``), so
        the running interpreter's LIBDIR goes first on ``LD_LIBRARY_PATH``. The stub's own
        ``sys.path`` is the base interpreter's, so the directory holding numpy is added to
        ``PYTHONPATH`` (models import numpy through ``triton_python_backend_utils``).
        """
        env = dict(os.environ if base is None else base)
        lib_dirs = [sysconfig.get_config_var("LIBDIR") or "", str(self.libs_dir)]
        if env.get("LD_LIBRARY_PATH"):
            lib_dirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(d for d in lib_dirs if d)
        import numpy  # the stub must load this same numpy

        numpy_parent = str(Path(numpy.__file__).resolve().parent.parent)
        paths = [numpy_parent] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.pop("TRITONSERVER_DELAY_SCHEDULER", None)
        return env


# --------------------------------------------------------------------------------------------
# Model repositories written from code

LOCKED_DEVICE_SOURCE = '''\
"""GPU-like model (written by tests/support/real_triton.py): host work overlaps, device work is
serialised.

Each execute() sleeps HOST_MS outside any lock (instances overlap, as host work does), then
DEVICE_MS + PER_ITEM_MS * batch under an exclusive file lock shared by every instance process
(one device runs one batch at a time). Input k is returned as output k.
"""

import fcntl
import time

import triton_python_backend_utils as pb_utils

LOCK = {lock!r}
HOST_MS = {host_ms!r}
DEVICE_MS = {device_ms!r}
PER_ITEM_MS = {per_item_ms!r}


class TritonPythonModel:
    def initialize(self, args):
        self.lock = open(LOCK, "a")

    def execute(self, requests):
        items = sum(pb_utils.get_input_tensor_by_name(r, "INPUT0").shape()[0] for r in requests)
        time.sleep(HOST_MS / 1000.0)
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            time.sleep((DEVICE_MS + PER_ITEM_MS * items) / 1000.0)
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor.from_dlpack(
                        "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0")
                    )
                ]
            )
            for r in requests
        ]

    def finalize(self):
        self.lock.close()
'''


def locked_device_source(lock: Path, host_ms: float, device_ms: float, per_item_ms: float) -> str:
    """``model.py`` of a GPU-like Python-backend model (:data:`LOCKED_DEVICE_SOURCE`): ``host_ms``
    that overlaps across instances, then ``device_ms + per_item_ms * batch`` serialised by an
    exclusive lock on the file ``lock``, which every instance of every model using it shares."""
    return LOCKED_DEVICE_SOURCE.format(
        lock=str(lock),
        host_ms=float(host_ms),
        device_ms=float(device_ms),
        per_item_ms=float(per_item_ms),
    )


SLEEP_MODEL_SOURCE = '''\
"""Identity model with a configurable execution time (written by tests/support/real_triton.py).

Input k is returned as output k (pairing by position in the config). Each execute() sleeps
execute_delay_ms + execute_delay_ms_per_item * (sum of the requests' batch sizes), read from the
config parameters.
"""

import json
import time

import triton_python_backend_utils as pb_utils


def _param(config, key):
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return float(value) if value else 0.0


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.delay_s = _param(config, "execute_delay_ms") / 1000.0
        self.per_item_s = _param(config, "execute_delay_ms_per_item") / 1000.0
        self.batching = config.get("max_batch_size", 0) > 0
        self.pairs = [
            (i["name"], o["name"], i["data_type"] == "TYPE_STRING")
            for i, o in zip(config["input"], config["output"])
        ]

    def execute(self, requests):
        items = len(requests)
        if self.batching and self.per_item_s > 0:
            first = self.pairs[0][0]
            items = sum(
                pb_utils.get_input_tensor_by_name(r, first).shape()[0] for r in requests
            )
        delay = self.delay_s + self.per_item_s * items
        if delay > 0:
            time.sleep(delay)
        responses = []
        for request in requests:
            outputs = []
            for in_name, out_name, is_bytes in self.pairs:
                tensor = pb_utils.get_input_tensor_by_name(request, in_name)
                if tensor is None:  # an optional input may be absent
                    continue
                if not is_bytes:
                    # The wheel's stub is built against numpy 1: pb_utils.Tensor(name, ndarray)
                    # reads zeros from a numpy 2 array. DLPack hands over the input buffer as is.
                    outputs.append(pb_utils.Tensor.from_dlpack(out_name, tensor))
                else:  # BYTES has no DLPack form
                    outputs.append(pb_utils.Tensor(out_name, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''


@dataclass(frozen=True)
class TensorSpec:
    """One model input (its paired output gets the same type and dims).

    Attributes:
        name: input name; the paired output is named by replacing ``INPUT`` with ``OUTPUT``.
        dims: per-item dims (no batch dim); ``-1`` marks a variable dimension.
        data_type: ``ModelConfig`` type name, e.g. ``"TYPE_FP32"``.
        allow_ragged_batch: lets requests with different shapes share a batch.
        optional: the input may be omitted by a request.
    """

    name: str = "INPUT0"
    dims: tuple[int, ...] = (16,)
    data_type: str = "TYPE_FP32"
    allow_ragged_batch: bool = False
    optional: bool = False

    @property
    def output_name(self) -> str:
        """Name of the output that echoes this input."""
        return (
            self.name.replace("INPUT", "OUTPUT", 1) if "INPUT" in self.name else f"{self.name}_OUT"
        )


def dynamic_batching(
    *,
    preferred: Sequence[int] = (),
    max_queue_delay_us: int = 0,
    priority_levels: int = 0,
    default_priority_level: int = 0,
    timeout_us: int = 0,
    timeout_action: str = "REJECT",
    allow_timeout_override: bool = False,
    max_queue_size: int = 0,
    preserve_ordering: bool = False,
) -> mc.ModelDynamicBatching:
    """Build a ``dynamic_batching`` block; the arguments map 1:1 onto the proto fields.

    ``timeout_us``, ``timeout_action``, ``allow_timeout_override`` and ``max_queue_size`` fill
    ``default_queue_policy`` (left unset when all are defaults, as in a hand-written config).
    """
    block = mc.ModelDynamicBatching(
        preferred_batch_size=list(preferred),
        max_queue_delay_microseconds=max_queue_delay_us,
        priority_levels=priority_levels,
        default_priority_level=default_priority_level,
        preserve_ordering=preserve_ordering,
    )
    if timeout_us or timeout_action != "REJECT" or allow_timeout_override or max_queue_size:
        block.default_queue_policy.CopyFrom(
            mc.ModelQueuePolicy(
                timeout_action=mc.ModelQueuePolicy.TimeoutAction.Value(timeout_action),
                default_timeout_microseconds=timeout_us,
                allow_timeout_override=allow_timeout_override,
                max_queue_size=max_queue_size,
            )
        )
    return block


def sleep_model_config(
    name: str,
    *,
    max_batch_size: int = 8,
    inputs: Sequence[TensorSpec] = (TensorSpec(),),
    dynamic_batching: mc.ModelDynamicBatching | None = None,
    instance_count: int = 1,
    execute_delay_ms: float = 0.0,
    execute_delay_ms_per_item: float = 0.0,
    backend: str = "python",
    extra_parameters: Mapping[str, str] | None = None,
) -> mc.ModelConfig:
    """The ``ModelConfig`` of a sleep/identity model.

    Args:
        name: model name (also the directory name in the repository).
        max_batch_size: 0 disables batching dims.
        inputs: one output per input, same type and dims.
        dynamic_batching: the block (see :func:`dynamic_batching`); ``None`` = no dynamic batching.
        instance_count: number of ``KIND_CPU`` instances.
        execute_delay_ms: sleep per execution.
        execute_delay_ms_per_item: additional sleep per batch item of the execution.
        backend: ``"python"`` for Triton; the reference server uses its own backend name with the
            same parameters, so differential tests build both from this function.
        extra_parameters: more ``parameters`` entries (string values).
    """
    if backend == "python" and any(spec.data_type == "TYPE_STRING" for spec in inputs):
        # The wheel's stub is built against numpy 1; with numpy 2 it crashes decoding BYTES.
        raise ValueError("BYTES tensors do not work in the pytriton stub with numpy 2")
    config = mc.ModelConfig(name=name, backend=backend, max_batch_size=max_batch_size)
    for spec in inputs:
        data_type = mc.DataType.Value(spec.data_type)
        config.input.append(
            mc.ModelInput(
                name=spec.name,
                data_type=data_type,
                dims=list(spec.dims),
                allow_ragged_batch=spec.allow_ragged_batch,
                optional=spec.optional,
            )
        )
        config.output.append(
            mc.ModelOutput(name=spec.output_name, data_type=data_type, dims=list(spec.dims))
        )
    if dynamic_batching is not None:
        config.dynamic_batching.CopyFrom(dynamic_batching)
    config.instance_group.append(
        mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=instance_count)
    )
    params = {
        "execute_delay_ms": _number_text(execute_delay_ms),
        "execute_delay_ms_per_item": _number_text(execute_delay_ms_per_item),
        **(extra_parameters or {}),
    }
    for key, value in params.items():
        config.parameters[key].string_value = value
    return config


def identity_model_config(
    name: str = "identity",
    *,
    max_batch_size: int = 8,
    dims: tuple[int, ...] = (16,),
    max_queue_delay_us: int = 100,
    instance_count: int = 1,
) -> mc.ModelConfig:
    """An FP32 identity model (``INPUT0`` → ``OUTPUT0``) with dynamic batching on."""
    return sleep_model_config(
        name,
        max_batch_size=max_batch_size,
        inputs=(TensorSpec(dims=dims),),
        dynamic_batching=dynamic_batching(max_queue_delay_us=max_queue_delay_us),
        instance_count=instance_count,
    )


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# --------------------------------------------------------------------------------------------
# The server process


@dataclass
class RealTriton(ServerHandle):
    """A ``tritonserver`` process on 127.0.0.1 with free ports and explicit model control.

    Args:
        install: where the binary lives (:meth:`TritonInstall.locate`).
        workdir: scratch directory; the repository (``repo/``), backends and log go there.
        models: configs written into the repository before start and loaded at startup.
        delay_scheduler: value of ``TRITONSERVER_DELAY_SCHEDULER`` (``None`` = unset).
        extra_args: more ``tritonserver`` flags.
        startup_timeout_s: how long to wait for ``/v2/health/ready``.
    """

    install: TritonInstall
    workdir: Path
    models: Sequence[mc.ModelConfig] = ()
    delay_scheduler: int | None = None
    extra_args: Sequence[str] = ()
    startup_timeout_s: float = 60.0
    #: The server's working directory (None: ``workdir``). The stub ignores ``PYTHONPATH``, but
    #: its ``sys.path`` starts with its working directory: one holding numpy 1
    #: (:func:`tests.support.stream_model.stub_numpy1`) lets models take BYTES tensors.
    cwd: Path | None = None
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def repository(self) -> Path:
        """The model repository directory."""
        return self.workdir / "repo"

    @property
    def log_path(self) -> Path:
        """Combined stdout/stderr of the server."""
        return self.workdir / "tritonserver.log"

    @property
    def http_url(self) -> str:
        """``host:port`` as ``tritonclient.http`` wants it."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` as ``tritonclient.grpc`` wants it."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus endpoint."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        """Process id while running."""
        return self._process.pid if self._process is not None else None

    def __enter__(self) -> RealTriton:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, attempts: int = 3) -> None:
        """Write the startup models, start the process and wait until it is ready.

        Ports are picked free just before the start; if another process grabs one in between,
        the start is retried with new ports.

        Raises:
            TritonStartError: the server exited or did not become ready in time.
        """
        if self._process is not None:
            raise RuntimeError("RealTriton already started")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.repository.mkdir(exist_ok=True)
        backends = self.install.prepare_backends(self.workdir / "backends")
        for config in self.models:
            self.add_model(config)
        error: TritonStartError | None = None
        for _ in range(attempts):
            self.http_port, self.grpc_port, self.metrics_port = _distinct_free_ports(3)
            self._spawn(backends)
            try:
                self._wait_ready()
                return
            except TritonStartError as exc:
                error = exc
                self.stop()
                if "already in use" not in str(exc).lower():
                    break
        assert error is not None
        raise error

    def _spawn(self, backends: Path) -> None:
        args = [
            str(self.install.server_bin),
            f"--model-repository={self.repository}",
            f"--backend-directory={backends}",
            "--model-control-mode=explicit",
            # Configs are used exactly as written, as the reference server does.
            "--disable-auto-complete-config",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            "--exit-timeout-secs=30",
            *(f"--load-model={config.name}" for config in self.models),
            *self.extra_args,
        ]
        env = self.install.environment()
        if self.delay_scheduler is not None:
            env["TRITONSERVER_DELAY_SCHEDULER"] = str(self.delay_scheduler)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {' '.join(args)}\n".encode())
            log.flush()
            # A new session: stop() kills the server and its stub processes as one group.
            self._process = subprocess.Popen(
                args,
                cwd=self.cwd or self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise TritonStartError(
                    f"tritonserver exited with {self._process.returncode}:\n{self.log_tail()}"
                )
            if self.http_status("GET", "/v2/health/ready")[0] == 200:
                # Triton keeps running when one of its endpoints cannot bind (a port taken
                # between picking and binding): treat that as a failed start so it is retried.
                current = self.log_tail(200_000).rsplit("\n=== ", 1)[-1]  # this attempt only
                failed = [line for line in current.splitlines() if _BIND_FAILED in line]
                if failed:
                    raise TritonStartError(f"tritonserver endpoint failed: {failed[-1]}")
                if (
                    http_request(f"http://127.0.0.1:{self.metrics_port}", "GET", "/metrics")[0]
                    == 200
                ):
                    return
            time.sleep(0.1)
        raise TritonStartError(
            f"tritonserver not ready after {self.startup_timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def stop(self, graceful: bool = False, timeout_s: float = 30.0) -> None:
        """Stop the server and its Python-backend stub processes.

        Args:
            graceful: SIGTERM and let Triton unload its models (2-4 s with Python models),
                SIGKILL after ``timeout_s``. Default: SIGKILL the process group at once, which
                tests and benchmarks prefer; the shared-memory regions the stubs had mapped
                (``/dev/shm/triton_python_backend_shm_region_*``), which only a graceful
                unload removes, are then deleted here.
            timeout_s: grace period of a graceful stop.
        """
        process, self._process = self._process, None
        if process is None:
            return
        regions = _mapped_shm_regions(process.pid)
        if graceful:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout_s)
        # Kill whatever is left of the group (stubs may outlive the server by a moment) and wait
        # until none of it runs, so the caller sees no leftovers. A killed stub is a zombie of
        # the machine's init until init reaps it (1.5 s here): it holds no port and no memory,
        # so it is not waited for.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10.0)
        kill_group(process.pid)
        for region in regions:
            with contextlib.suppress(FileNotFoundError):
                region.unlink()

    def restart(self) -> None:
        """Stop and start again (fresh statistics and metrics; models reloaded from disk)."""
        self.stop()
        self.start()

    def revive(self) -> None:
        """Start again on the ports it had, as a restarted pod comes back at its address
        (the startup models loaded from disk); after :meth:`stop` or a kill."""
        self.stop()
        self._spawn(self.install.prepare_backends(self.workdir / "backends"))
        self._wait_ready()

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server log (for assertion messages)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    # -- repository and plain HTTP --------------------------------------------------------------

    def add_model(self, config: mc.ModelConfig, model_source: str | None = None) -> Path:
        """Write a model into the repository (it still has to be loaded).

        ``model_source`` is its ``model.py`` (``None``: :data:`SLEEP_MODEL_SOURCE`).
        """
        source = SLEEP_MODEL_SOURCE if model_source is None else model_source
        return write_model(self.repository, config.name, config, model_source=source)

    def unload_model(self, name: str) -> None:
        """``POST /v2/repository/models/<name>/unload`` (returns before the unload finishes)."""
        status, payload = self.http_status("POST", f"/v2/repository/models/{name}/unload", {})
        if status != 200:
            raise RuntimeError(f"unload of {name!r} failed ({status}): {payload.decode()}")


def _mapped_shm_regions(pgid: int) -> set[Path]:
    """Python-backend shared-memory files mapped by the processes of a process group."""
    regions: set[Path] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:
                continue
            with open(f"/proc/{entry}/maps") as maps:
                for line in maps:
                    path = line.rsplit(maxsplit=1)[-1]
                    if path.startswith("/dev/shm/triton_python_backend_shm_region_"):
                        regions.add(Path(path))
        except OSError:
            continue  # the process went away meanwhile
    return regions


def _distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports
