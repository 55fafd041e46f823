"""The one way tests run a server: the reference server (thread or process) or a real Triton.

Everything a test needs to start a server and wait for it lives here:

- :func:`wait_until` -- the one poll-until-true helper; it fails loudly (``AssertionError``
  naming what it waited for, with the last value or exception, e.g. a :class:`NotYet`), so a
  test never sleeps a fixed time to let something happen.
- :func:`write_model` / :func:`write_sim_model` -- model directories (a config text or a
  ``ModelConfig``; the simulated device's linear profile).
- :class:`ChildProcess` -- a child whose stdout lines are read by a thread (no blocking reads),
  stderr into a log file, stopped as a process group.
- :class:`ServerHandle` -- the methods shared by every server handle (``load_model``,
  ``model_stats``, ``metrics_text``, ``http_status``).
- :class:`ReferenceServer` (``reference_server.ServerThread`` in this process) and
  :class:`ReferenceProcess` (``python -m reference_server``), both on port 0; the process's
  ports are read from its ready line with :func:`reference_server.ready.parse_ready_line`, the
  one parser. :class:`tests.support.real_triton.RealTriton` is the real Triton's handle.
- :func:`start_server` -- either server, by kind, with the same models loaded.

Model configs for differential tests are written once, for Triton's Python backend; for the
reference server the backend is swapped for its built-in ``identity`` backend
(:func:`for_reference`), which reads the same ``execute_delay_ms`` / ``execute_delay_ms_per_item``
parameters.

This module imports only the standard library at import time (``tritonclient`` and the server
are imported where used), so the light test helpers stay light.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as mc

    from reference_server.ready import ServerAddresses
    from tests.support.real_triton import RealTriton, TritonInstall

REPO_ROOT = Path(__file__).resolve().parents[2]
ServerKind = Literal["triton", "reference"]
T = TypeVar("T")

#: The reference server's backend that mirrors the Python-backend sleep model.
REFERENCE_BACKEND = "identity"
#: ``python -m reference_server`` flags that bind every endpoint to a free port.
PORT_ZERO = ("--http-port", "0", "--grpc-port", "0", "--metrics-port", "0")
#: Not passed on to children: they would change what a child does (login, batch formation).
_NOT_INHERITED = ("PERFSWEEP_UI_PASSWORD", "PERFSWEEP_UI_USER", "TRITONSERVER_DELAY_SCHEDULER")


# --------------------------------------------------------------------------------------------
# Waiting


class NotYet(Exception):
    """Raised by a :func:`wait_until` predicate: not done yet, and why (shown on timeout)."""


def wait_until(
    predicate: Callable[[], T], timeout_s: float, what: str, *, poll_s: float | None = None
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    An exception from ``predicate`` counts as "not yet" (a server that is still starting refuses
    connections); the last one is shown if time runs out. A predicate raises :class:`NotYet`
    to say why it is not done yet. An ``AssertionError`` is not waited out: a predicate asserts
    what must hold while it waits (``the child still runs``) and fails the wait at once.

    Args:
        predicate: the condition; called at least once, also after the deadline has passed.
        timeout_s: how long to keep polling (a bound, never a measurement).
        what: what is awaited, for the failure message ("the model is unloaded").
        poll_s: pause between two calls; ``None``: 10 ms, doubling up to 0.2 s (quick
            conditions are seen at once, long waits do not hammer a server).

    Raises:
        AssertionError: ``timeout_s`` passed; the message names ``what`` and the last value or
            exception.
    """
    deadline = time.monotonic() + timeout_s
    pause_s = 0.01 if poll_s is None else poll_s
    while True:
        error: Exception | None = None
        value: Any = None
        try:
            value = predicate()
        except AssertionError:
            raise
        except Exception as exc:
            error = exc
        if value:
            return value  # type: ignore[no-any-return]
        if time.monotonic() >= deadline:
            last = f"last exception: {error!r}" if error is not None else f"last value: {value!r}"
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} ({last})")
        time.sleep(pause_s)
        if poll_s is None:
            pause_s = min(2 * pause_s, 0.2)


# --------------------------------------------------------------------------------------------
# Model repositories


def write_model(
    repository: Path,
    name: str,
    config: str | mc.ModelConfig,
    *,
    versions: Sequence[int] = (1,),
    add_name: bool = False,
    model_source: str = "",
    files: Mapping[str, str] | None = None,
) -> Path:
    """Write ``repository/name/config.pbtxt`` and the version directories; return the model dir.

    Args:
        repository: model repository root (created if missing).
        name: model (directory) name; a ``ModelConfig`` must carry the same name.
        config: config text (written as is) or a ``ModelConfig`` (written as text format).
        versions: version directories to create.
        add_name: put ``name: "<name>"`` in front of a config text that leaves it out.
        model_source: ``model.py`` written into every version directory (Triton's Python
            backend); ``""`` writes none.
        files: more files beside ``config.pbtxt`` (name -> text), e.g. a device profile.
    """
    if isinstance(config, str):
        text = f'name: "{name}"\n{config}' if add_name else config
    else:
        from google.protobuf import text_format

        if config.name != name:
            raise ValueError(f"config is named {config.name!r}, not {name!r}")
        text = text_format.MessageToString(config)
    model_dir = repository / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text, encoding="utf-8")
    for file_name, content in (files or {}).items():
        (model_dir / file_name).write_text(content, encoding="utf-8")
    for version in versions:
        (model_dir / str(version)).mkdir(exist_ok=True)
        if model_source:
            (model_dir / str(version) / "model.py").write_text(model_source, encoding="utf-8")
    return model_dir


def write_sim_model(
    repository: Path,
    name: str,
    device_ms: float,
    per_item_ms: float = 0.0,
    max_batch_size: int = 0,
    instances: int = 1,
    dynamic_batching: str = "",
    host_ms: float = 0.0,
    width: int = 16,
) -> Path:
    """A simulated model of ``width`` floats in and out with a jitter-free profile: device =
    device_ms + per_item_ms * b.

    Args:
        repository: model repository root.
        name: model name.
        device_ms: device time of one execution.
        per_item_ms: additional device time per batch item.
        max_batch_size: 0 disables batching.
        instances: ``KIND_CPU`` instance count.
        dynamic_batching: a whole ``dynamic_batching { ... }`` block, or ``""`` for none.
        host_ms: host time before the device part and again after it, per execution (what
            more instances overlap; the device part is serialised across them).
        width: the input's and the output's one dimension.
    """
    model_dir = repository / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "profile.toml").write_text(
        textwrap.dedent(
            f"""\
            name = "{name}_profile"
            provenance = "SYNTHETIC test profile: {device_ms} ms + {per_item_ms} ms per item, no jitter"
            seed = 0
            jitter = 0.0

            [device]
            a_ms = {device_ms}
            b_ms = {per_item_ms}

            [host_pre]
            a_ms = {host_ms}

            [host_post]
            a_ms = {host_ms}
            """
        )
    )
    dims = f"[ {width} ]"
    (model_dir / "config.pbtxt").write_text(
        textwrap.dedent(
            f"""\
            name: "{name}"
            backend: "simulated"
            max_batch_size: {max_batch_size}
            input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }} ]
            output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }} ]
            instance_group [ {{ kind: KIND_CPU count: {instances} }} ]
            parameters {{ key: "profile" value: {{ string_value: "profile.toml" }} }}
            {dynamic_batching}
            """
        )
    )
    return model_dir


def for_reference(config: mc.ModelConfig) -> mc.ModelConfig:
    """A copy of a Triton sleep-model config for the reference server's identity backend."""
    from tritonclient.grpc import model_config_pb2

    copy = model_config_pb2.ModelConfig()
    copy.CopyFrom(config)
    if copy.platform != "ensemble":  # an ensemble runs on its composing models
        copy.backend = REFERENCE_BACKEND
    return copy


def model_config_json(config: mc.ModelConfig) -> str:
    """The ``config`` string of a repository ``load`` override (protobuf JSON, proto names)."""
    from google.protobuf import json_format

    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)


# --------------------------------------------------------------------------------------------
# Child processes


def child_env(**extra: str) -> dict[str, str]:
    """This environment for a child: the repository importable, unbuffered, ``extra`` set."""
    env = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class ChildProcess:
    """A child process in its own session; a thread moves its stdout lines into a queue.

    stderr goes to ``log`` (read back with :meth:`tail` / :meth:`stderr`). Lines are read without
    blocking the test, so every wait is bounded and names what it waited for.

    Args:
        args: the command line.
        log: file for the child's stderr; ``None``: this process's stderr (shown by pytest).
        env: its environment (default :func:`child_env`).
        stdin_pipe: give it a pipe on stdin (:meth:`send`); otherwise ``/dev/null``.
        cwd: its working directory (default: the repository's root).
    """

    def __init__(
        self,
        args: Sequence[str],
        log: Path | None,
        env: Mapping[str, str] | None = None,
        *,
        stdin_pipe: bool = False,
        cwd: Path | None = None,
    ) -> None:
        self.log = log
        self._stderr = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            self._stderr = log.open("wb")
        self.proc = subprocess.Popen(
            list(args),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            text=True,
            env=dict(env) if env is not None else child_env(),
            cwd=cwd or REPO_ROOT,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    @property
    def pid(self) -> int:
        """Process id (also the id of its process group)."""
        return int(self.proc.pid)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, match: str | Callable[[str], Any], timeout_s: float = 120.0) -> str:
        """The first new stdout line that starts with ``match`` (or for which ``match`` is true).

        Raises:
            AssertionError: the child exited or ``timeout_s`` passed first; the message has the
                last stdout lines and the stderr tail.
        """
        accept = match if callable(match) else lambda line: line.startswith(match)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    self._pump_thread.join(5)  # the last lines may still be on their way
                    if self.lines.empty():
                        break
                continue
            self.seen.append(line)
            if accept(line):
                return line
        state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        raise AssertionError(
            f"no stdout line matching {match!r} ({state}); stdout {self.seen[-5:]}; "
            f"stderr tail: {self.tail()}"
        )

    def wait_ready(self, timeout_s: float = 120.0) -> ServerAddresses:
        """The addresses on the reference server's ready line (read with the one parser)."""
        from reference_server.ready import parse_ready_line

        addresses = parse_ready_line(self.wait_line(parse_ready_line, timeout_s))
        assert addresses is not None
        return addresses

    def send(self, line: str) -> None:
        """Write one line to the child's stdin (``stdin_pipe=True``)."""
        assert self.proc.stdin is not None, "started without stdin_pipe"
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        """EOF on the child's stdin."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()

    def wait(self, timeout_s: float) -> int:
        """The exit status once the child has exited by itself (``TimeoutExpired`` otherwise)."""
        return int(self.proc.wait(timeout_s))

    def stdout(self, timeout_s: float = 10.0) -> str:
        """Everything the (exited) child printed, once its stdout is read to the end."""
        self._pump_thread.join(timeout_s)
        return "\n".join([*self.seen, *self.lines.queue])

    def stderr(self) -> str:
        """Everything the child wrote to stderr so far (``""`` when it was not logged)."""
        if self._stderr is None or self.log is None:
            return ""
        if not self._stderr.closed:
            self._stderr.flush()
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 15) -> str:
        """Last lines of stderr."""
        return "\n".join(self.stderr().splitlines()[-lines:])

    def stop(self, timeout_s: float = 20.0, signum: int = signal.SIGTERM) -> int:
        """Send ``signum`` (the child cleans up its own children), SIGKILL the group if it hangs.

        Returns:
            The child's exit status.
        """
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        with contextlib.suppress(ProcessLookupError):  # anything it left behind in its group
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.close_stdin()
        self._pump_thread.join(5)  # EOF once the group is gone; then the pipe can close
        if self.proc.stdout is not None and not self._pump_thread.is_alive():
            self.proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
        return int(self.proc.returncode)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the caller must tolerate a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def remote_load_worker(
    cli: Sequence[str], port: int, **popen: Any
) -> Iterator[subprocess.Popen[str]]:
    """A ``perfsweep load --worker`` process (``cli``: the perfsweep command) waiting for a
    Locust master on 127.0.0.1:``port``, as a worker on another host would; killed on exit when
    it is still running. Its stderr is piped (read it with ``communicate``)."""
    worker = subprocess.Popen(
        [*cli, "load", "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    try:
        yield worker
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate(timeout=30)


@contextlib.contextmanager
def cached_reference_server(repository: Path, cache_bytes: int) -> Iterator[str]:
    """A reference server on ``repository`` (device ``cpu``, ports chosen by the system) with a
    response cache of ``cache_bytes``; yields its HTTP address and stops it on exit. Its log is
    ``server.log`` beside the repository."""
    child = ChildProcess(
        [
            sys.executable,
            "-m",
            "reference_server",
            "--model-repository",
            str(repository),
            *PORT_ZERO,
            "--device",
            "cpu",
            "--cache-size",
            str(cache_bytes),
        ],
        repository.parent / "server.log",
    )
    try:
        yield child.wait_ready(120.0).http_url
    finally:
        child.stop()


def process_gone(pid: int) -> bool:
    """The process no longer runs (a zombie waiting for its new parent to reap it counts)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:
        return False


def children_of(pid: int) -> dict[int, str]:
    """The live direct children of ``pid`` (from ``/proc``): pid -> command line."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # it ended while we looked
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found[int(entry)] = command
    return found


def wait_all_gone(pids: Mapping[int, str], timeout_s: float, what: str) -> None:
    """Wait until every pid in ``pids`` has ended; fail naming the survivors otherwise."""
    alive = dict(pids)

    def all_gone() -> bool:
        for pid in [p for p in alive if process_gone(p)]:
            del alive[pid]
        return not alive

    try:
        wait_until(all_gone, timeout_s, what, poll_s=0.1)
    except AssertionError:
        raise AssertionError(f"{what}: still running {timeout_s:g} s later: {alive}") from None


def supervised_pid(log_text: str, label: str = "server") -> int | None:
    """The pid in a supervised child's log line ``--- perfsweep: <label> pid N`` (the last one).

    ``analyzer.target.supervise`` writes that line; the child's own ready line in the same log is
    read with :func:`reference_server.ready.last_ready`.
    """
    found = re.findall(rf"^--- perfsweep: {re.escape(label)} pid (\d+)", log_text, re.MULTILINE)
    return int(found[-1]) if found else None


# --------------------------------------------------------------------------------------------
# Server handles


def http_request(
    base_url: str,
    method: str,
    path: str,
    body: Mapping[str, Any] | None = None,
    timeout_s: float = 10.0,
) -> tuple[int, bytes]:
    """A plain HTTP request without tritonclient; ``(0, b"")`` when the server is unreachable.

    Args:
        base_url: ``http://host:port``.
        method: ``GET`` or ``POST``.
        path: absolute path, e.g. ``/v2/health/ready``.
        body: JSON body (POST).
        timeout_s: socket timeout.
    """
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base_url + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return int(reply.status), bytes(reply.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


class ServerHandle:
    """What every running server offers a test, over plain HTTP.

    Subclasses provide ``http_url`` (``host:port``) and ``metrics_url`` (full URL), and
    :meth:`server_config` when their server needs a config converted.
    """

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP endpoint."""
        raise NotImplementedError

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus endpoint."""
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the HTTP endpoint, for plain HTTP requests."""
        return f"http://{self.http_url}"

    def server_config(self, config: mc.ModelConfig) -> mc.ModelConfig:
        """``config`` (Triton flavour) as this server should get it."""
        return config

    def load_model(self, name: str, config: mc.ModelConfig | None = None) -> None:
        """``POST /v2/repository/models/<name>/load``, optionally with a config override.

        Raises:
            RuntimeError: the server refused; the message is the server's.
        """
        body: dict[str, Any] = {}
        if config is not None:
            body = {"parameters": {"config": model_config_json(self.server_config(config))}}
        status, payload = self.http_status(
            "POST", f"/v2/repository/models/{name}/load", body, timeout_s=120
        )
        if status != 200:
            raise RuntimeError(f"load of {name!r} failed ({status}): {payload.decode()}")

    def model_stats(self, name: str) -> dict[str, Any]:
        """The statistics-extension entry of the model's (single) version."""
        status, payload = self.http_status("GET", f"/v2/models/{name}/stats")
        if status != 200:
            raise RuntimeError(f"stats of {name!r} failed ({status}): {payload.decode()}")
        stats: dict[str, Any] = json.loads(payload)["model_stats"][0]
        return stats

    def metrics_text(self) -> str:
        """The Prometheus exposition text."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as reply:
            return str(reply.read().decode())

    def http_status(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        timeout_s: float = 10.0,
    ) -> tuple[int, bytes]:
        """One plain HTTP request; ``(status, body)`` (``(0, b"")`` if unreachable)."""
        return http_request(self.base_url, method, path, body, timeout_s)


class ReferenceServer(ServerHandle):
    """``reference_server.ServerThread`` on loopback with free ports and a written repository.

    Args:
        workdir: scratch directory; the repository goes to ``workdir/repo``.
        models: configs (Triton flavour) written and loaded at startup.
        delay_scheduler: ``TRITONSERVER_DELAY_SCHEDULER`` for the reference batcher.
        options: more ``reference_server.ServerOptions`` fields (e.g. ``rate_limit``).
    """

    def __init__(
        self,
        workdir: Path,
        models: Sequence[mc.ModelConfig] = (),
        delay_scheduler: int | None = None,
        *,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.workdir = workdir
        self.models = list(models)
        self.delay_scheduler = delay_scheduler
        self.options = dict(options or {})
        self._server: Any = None

    @property
    def repository(self) -> Path:
        """The model repository directory."""
        return self.workdir / "repo"

    def _write_models(self) -> None:
        self.repository.mkdir(parents=True, exist_ok=True)
        for config in self.models:
            self.add_model(config)

    def start(self) -> None:
        """Write the models and start the server thread (imports the reference server lazily)."""
        from reference_server import ServerOptions, ServerThread

        self._write_models()
        options = ServerOptions(
            model_repositories=(self.repository,),
            models=tuple(c.name for c in self.models),
            device="cpu",
            # 0, not None: None would read TRITONSERVER_DELAY_SCHEDULER from this process.
            delay_scheduler=self.delay_scheduler or 0,
            **self.options,
        )
        self._server = ServerThread(options).start()

    def stop(self) -> None:
        """Stop the server thread."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __enter__(self) -> ReferenceServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def http_url(self) -> str:
        """``host:port`` for ``tritonclient.http``."""
        return str(self._server.http_url)

    @property
    def grpc_url(self) -> str:
        """``host:port`` for ``tritonclient.grpc``."""
        return str(self._server.grpc_url)

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus endpoint."""
        return str(self._server.metrics_url)

    def server_config(self, config: mc.ModelConfig) -> mc.ModelConfig:
        """The identity-backend twin of a Triton sleep-model config (:func:`for_reference`)."""
        return for_reference(config)

    def add_model(self, config: mc.ModelConfig, model_source: str | None = None) -> Path:
        """Write a (Triton-flavoured) config into the repository, for the identity backend."""
        return write_model(self.repository, config.name, for_reference(config))


def reference_server_command(*args: str, python: str = sys.executable) -> list[str]:
    """``python -m reference_server ARGS`` in ``python``."""
    return [python, "-m", "reference_server", *args]


class ReferenceProcess(ReferenceServer):
    """The reference server as its own process (``python -m reference_server``), on port 0.

    Benchmarks use this so that the server does not share a GIL with the load generator, as the
    real Triton does not. The handle is the same as :class:`ReferenceServer`'s; the bound ports
    come from the ready line. :attr:`child` is the :class:`ChildProcess` while it runs.

    Args:
        workdir: scratch directory (repository, ``reference_server.log``).
        models: configs (Triton flavour) written and loaded at startup.
        python: interpreter to run it with (default: this one).
        startup_timeout_s: how long to wait for the ready line.
        repository: serve this existing repository instead of writing ``workdir/repo``.
        args: more server flags (``--model``, ``--host``, ...).
        device: ``--device`` (``None``: the server's default).
        launcher: words in front of the interpreter (e.g. ``ip netns exec NS``).
        log: the server's stderr (default ``workdir/reference_server.log``).
    """

    def __init__(
        self,
        workdir: Path,
        models: Sequence[mc.ModelConfig] = (),
        *,
        python: str = sys.executable,
        startup_timeout_s: float = 60.0,
        repository: Path | None = None,
        args: Sequence[str] = (),
        device: str | None = "cpu",
        launcher: Sequence[str] = (),
        log: Path | None = None,
    ) -> None:
        super().__init__(workdir, models)
        self._log = log
        self.python = python
        self.startup_timeout_s = startup_timeout_s
        self._repository = repository
        self.args = tuple(args)
        self.device = device
        self.launcher = tuple(launcher)
        self.child: ChildProcess | None = None
        self.addresses: ServerAddresses | None = None
        self.returncode: int | None = None  # the exit status, once stopped

    @property
    def repository(self) -> Path:
        """The model repository directory."""
        return self._repository if self._repository is not None else self.workdir / "repo"

    @property
    def log_path(self) -> Path:
        """The server's stderr."""
        return self._log if self._log is not None else self.workdir / "reference_server.log"

    @property
    def pid(self) -> int | None:
        """Process id (and process group id) while running."""
        return self.child.pid if self.child is not None else None

    def __enter__(self) -> ReferenceProcess:
        self.start()
        return self

    def command(self) -> list[str]:
        """The command line this handle starts."""
        args = [f"--model-repository={self.repository}"]
        args += [f"--model={c.name}" for c in self.models]
        args += [*PORT_ZERO, *(("--device", self.device) if self.device else ()), *self.args]
        return [*self.launcher, *reference_server_command(*args, python=self.python)]

    def start(self) -> None:
        """Write the models, start the process, wait for its ready line.

        Raises:
            RuntimeError: no ready line within ``startup_timeout_s`` (stderr tail included).
        """
        if self._repository is None:
            self._write_models()
        self.child = ChildProcess(self.command(), self.log_path)
        try:
            self.addresses = self.child.wait_ready(self.startup_timeout_s)
        except AssertionError as exc:
            self.stop()
            raise RuntimeError(f"reference server did not start: {exc}") from exc

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (clean shutdown), SIGKILL after ``timeout_s``."""
        child, self.child = self.child, None
        if child is not None:
            self.returncode = child.stop(timeout_s)

    def _bound(self) -> ServerAddresses:
        assert self.addresses is not None, "the reference process is not running"
        return self.addresses

    @property
    def http_url(self) -> str:
        """``host:port`` for ``tritonclient.http``."""
        return self._bound().http_url

    @property
    def grpc_url(self) -> str:
        """``host:port`` for ``tritonclient.grpc``."""
        return self._bound().grpc_url

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus endpoint."""
        return self._bound().metrics_url


@contextlib.contextmanager
def start_server(
    kind: ServerKind,
    workdir: Path,
    models: Sequence[mc.ModelConfig],
    *,
    delay_scheduler: int | None = None,
    triton_install: TritonInstall | None = None,
) -> Iterator[RealTriton | ReferenceServer]:
    """Start either server with ``models`` loaded; stop it on exit.

    Args:
        kind: ``"triton"`` (needs ``triton_install``) or ``"reference"``.
        workdir: scratch directory for the repository and logs.
        models: Triton-flavoured configs (see :func:`for_reference`).
        delay_scheduler: ``TRITONSERVER_DELAY_SCHEDULER``.
        triton_install: the located Triton installation.
    """
    server: RealTriton | ReferenceServer
    if kind == "triton":
        from tests.support.real_triton import RealTriton

        if triton_install is None:
            raise ValueError("a TritonInstall is needed to start the real Triton")
        server = RealTriton(triton_install, workdir, models=models, delay_scheduler=delay_scheduler)
    else:
        server = ReferenceServer(workdir, models=models, delay_scheduler=delay_scheduler)
    server.start()
    try:
        yield server
    finally:
        server.stop()
