"""A reference server in a child process, with the simulated device's pause hook on stdin.

Load tests import ``analyzer.load`` (gevent-patched process), so the server cannot run in a
thread of the test process; it runs here as ``python -m tests.load.refserver REPO MODEL...``,
prints the server's ready line, and then obeys stdin lines ``pause <model> <seconds>``
(answered with ``paused``). ``RefServer`` is the context manager tests use.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import TracebackType

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_sim_model(
    repository: Path,
    name: str,
    device_ms: float,
    per_item_ms: float = 0.0,
    max_batch_size: int = 0,
    instances: int = 1,
    dynamic_batching: str = "",
) -> Path:
    """A simulated model with a jitter-free linear profile: device = device_ms + per_item_ms * b."""
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
            """
        )
    )
    dims = "[ 16 ]"
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


class RefServer:
    """``python -m tests.load.refserver`` as a context manager with ``pause(model, seconds)``."""

    def __init__(self, repository: Path, models: tuple[str, ...]) -> None:
        self.repository = repository
        self.models = models
        self.proc: subprocess.Popen[str] | None = None
        self.http_url = self.grpc_url = self.metrics_url = ""

    def __enter__(self) -> RefServer:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.load.refserver", str(self.repository), *self.models],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO_ROOT,
        )
        from reference_server.ready import parse_ready_line

        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            addresses = parse_ready_line(line.strip())
            if addresses is not None:
                self.http_url, self.grpc_url = addresses.http_url, addresses.grpc_url
                self.metrics_url = addresses.metrics_url
                return self
        self.__exit__(None, None, None)
        raise RuntimeError("reference server exited before it was ready")

    def pause(self, model: str, seconds: float) -> None:
        """Hold the model's executions for ``seconds`` (returns once the pause is in effect)."""
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"pause {model} {seconds}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "paused"

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None:
            if self.proc.stdin:
                self.proc.stdin.close()  # EOF: the child stops its server and exits
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def _child(repository: str, models: list[str]) -> None:
    from reference_server.app import ServerOptions, serve

    options = ServerOptions(
        model_repositories=(Path(repository),),
        models=tuple(models),
        http_port=0,
        grpc_port=0,
        metrics_port=0,
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_ready(addresses, core) -> None:  # type: ignore[no-untyped-def]
            print(addresses.ready_line(), flush=True)

            def read_commands() -> None:
                for line in sys.stdin:
                    parts = line.split()
                    if parts[:1] == ["pause"]:
                        core.pause_device(parts[1], float(parts[2]))
                        print("paused", flush=True)
                loop.call_soon_threadsafe(stop.set)

            threading.Thread(target=read_commands, daemon=True).start()

        await serve(options, stop, on_ready)

    asyncio.run(main())


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2:])
