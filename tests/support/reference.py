"""The reference server with the same handle as :class:`tests.support.real_triton.RealTriton`.

Differential tests and benchmarks start either server through :func:`start_server` and then use
the same methods (``http_url``, ``load_model``, ``model_stats``, ``metrics_text``,
``http_status``) on both. Model configs are written once, for Triton's Python backend; for the
reference server the backend is swapped for its built-in ``identity`` backend, which reads the
same ``execute_delay_ms`` / ``execute_delay_ms_per_item`` parameters.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from tritonclient.grpc import model_config_pb2 as mc

from tests.support.real_triton import (
    RealTriton,
    TritonInstall,
    http_request,
    model_config_json,
    write_model,
)

ServerKind = Literal["triton", "reference"]

#: The reference server's backend that mirrors the Python-backend sleep model.
REFERENCE_BACKEND = "identity"


def for_reference(config: mc.ModelConfig) -> mc.ModelConfig:
    """A copy of a Triton sleep-model config for the reference server's identity backend."""
    copy = mc.ModelConfig()
    copy.CopyFrom(config)
    copy.backend = REFERENCE_BACKEND
    return copy


class ReferenceServer:
    """``reference_server.app.ServerThread`` on loopback with free ports and a written repository.

    Args:
        workdir: scratch directory; the repository goes to ``workdir/repo``.
        models: configs (Triton flavour) written and loaded at startup.
        delay_scheduler: ``TRITONSERVER_DELAY_SCHEDULER`` for the reference batcher.
    """

    def __init__(
        self,
        workdir: Path,
        models: Sequence[mc.ModelConfig] = (),
        delay_scheduler: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.models = list(models)
        self.delay_scheduler = delay_scheduler
        self._server: Any = None

    @property
    def repository(self) -> Path:
        """The model repository directory."""
        return self.workdir / "repo"

    def start(self) -> None:
        """Write the models and start the server thread (imports the reference server lazily)."""
        from reference_server.app import ServerOptions, ServerThread

        self.repository.mkdir(parents=True, exist_ok=True)
        for config in self.models:
            self.add_model(config)
        options = ServerOptions(
            model_repositories=(self.repository,),
            models=tuple(c.name for c in self.models),
            device="cpu",
            # 0, not None: None would read TRITONSERVER_DELAY_SCHEDULER from this process.
            delay_scheduler=self.delay_scheduler or 0,
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
    def base_url(self) -> str:
        """``http://host:port`` of the HTTP endpoint."""
        return f"http://{self.http_url}"

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus endpoint."""
        return str(self._server.metrics_url)

    def add_model(self, config: mc.ModelConfig, model_source: str | None = None) -> Path:
        """Write a (Triton-flavoured) config into the repository, for the identity backend."""
        return write_model(self.repository, for_reference(config), model_source="")

    def load_model(self, name: str, config: mc.ModelConfig | None = None) -> None:
        """Repository ``load``, optionally with a config override (converted like add_model)."""
        body: dict[str, Any] = {}
        if config is not None:
            body = {"parameters": {"config": model_config_json(for_reference(config))}}
        status, payload = self.http_status(
            "POST", f"/v2/repository/models/{name}/load", body, timeout_s=120
        )
        if status != 200:
            raise RuntimeError(f"load of {name!r} failed ({status}): {payload.decode()}")

    def model_stats(self, name: str) -> dict[str, Any]:
        """The statistics-extension entry of the model's (single) version."""
        import json

        status, payload = self.http_status("GET", f"/v2/models/{name}/stats")
        if status != 200:
            raise RuntimeError(f"stats of {name!r} failed ({status}): {payload.decode()}")
        stats: dict[str, Any] = json.loads(payload)["model_stats"][0]
        return stats

    def metrics_text(self) -> str:
        """The Prometheus exposition text."""
        import urllib.request

        with urllib.request.urlopen(self.metrics_url, timeout=10) as reply:
            return str(reply.read().decode())

    def http_status(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        timeout_s: float = 10.0,
    ) -> tuple[int, bytes]:
        """One plain HTTP request; ``(status, body)``."""
        return http_request(self.base_url, method, path, body, timeout_s)


class ReferenceProcess(ReferenceServer):
    """The reference server as its own process (``python -m reference_server``).

    Benchmarks use this so that the server does not share a GIL with the load generator, as the
    real Triton does not. The handle is the same as :class:`ReferenceServer`'s.

    Args:
        workdir: scratch directory (repository, ``reference_server.log``).
        models: configs (Triton flavour) written and loaded at startup.
        python: interpreter to run it with (default: this one).
        startup_timeout_s: how long to wait for the ready line.
    """

    def __init__(
        self,
        workdir: Path,
        models: Sequence[mc.ModelConfig] = (),
        *,
        python: str = sys.executable,
        startup_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(workdir, models)
        self.python = python
        self.startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[str] | None = None
        self._addresses: dict[str, str] = {}

    @property
    def pid(self) -> int | None:
        """Process id (and process group id) while running."""
        return self._process.pid if self._process is not None else None

    def __enter__(self) -> ReferenceProcess:
        self.start()
        return self

    def start(self) -> None:
        """Write the models, start the process, wait for its ready line."""
        self.repository.mkdir(parents=True, exist_ok=True)
        for config in self.models:
            self.add_model(config)
        args = [self.python, "-m", "reference_server", f"--model-repository={self.repository}"]
        args += [f"--model={c.name}" for c in self.models]
        args += ["--http-port=0", "--grpc-port=0", "--metrics-port=0", "--device=cpu"]
        env = dict(os.environ)
        env.pop("TRITONSERVER_DELAY_SCHEDULER", None)
        # The reference server is importable from the repository root (this file's grandparent).
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        log_path = self.workdir / "reference_server.log"
        with log_path.open("w") as log:  # the child keeps its own descriptor
            self._process = subprocess.Popen(
                args,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
                start_new_session=True,
            )
        from reference_server.ready import parse_ready_line

        addresses = parse_ready_line(_read_ready_line(self._process, self.startup_timeout_s))
        if addresses is None:
            self.stop()
            raise RuntimeError(f"reference server did not start; see {log_path}")
        self._addresses = {
            "http": addresses.http_url,
            "grpc": addresses.grpc_url,
            "metrics": addresses.metrics_url.removeprefix("http://").removesuffix("/metrics"),
        }

    def stop(self) -> None:
        """SIGTERM (clean shutdown), SIGKILL after 15 s."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
        if process.stdout is not None:
            process.stdout.close()

    @property
    def http_url(self) -> str:
        """``host:port`` for ``tritonclient.http``."""
        return self._addresses["http"]

    @property
    def grpc_url(self) -> str:
        """``host:port`` for ``tritonclient.grpc``."""
        return self._addresses["grpc"]

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus endpoint."""
        return f"http://{self._addresses['metrics']}/metrics"


def _read_ready_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    """The server's ready line (``READY_PREFIX ...``), or ``""`` after EOF or ``timeout_s``."""
    from reference_server.ready import READY_PREFIX

    assert process.stdout is not None
    stdout = process.stdout
    found: list[str] = []

    def scan() -> None:
        # A thread keeps the wait bounded; other output before the ready line is skipped.
        for line in stdout:
            if line.startswith(READY_PREFIX):
                found.append(line.strip())
                return

    reader = threading.Thread(target=scan, daemon=True)
    reader.start()
    reader.join(timeout_s)
    return found[0] if found else ""


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
