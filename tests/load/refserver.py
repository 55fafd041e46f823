"""A reference server in a child process, with the simulated device's pause hook on stdin.

Load tests import ``analyzer.load`` (gevent-patched process), so the server cannot run in a
thread of the test process; it runs here as ``python -m tests.load.refserver REPO MODEL...``,
prints the server's ready line, and then obeys stdin lines ``pause <model> <seconds>``
(answered with ``paused``). ``RefServer`` is the context manager tests use.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType

from tests.support.servers import REPO_ROOT, ChildProcess, child_env, write_sim_model

__all__ = ["REPO_ROOT", "RefServer", "write_sim_model"]  # the load tests import these from here


class RefServer:
    """``python -m tests.load.refserver`` as a context manager with ``pause(model, seconds)``."""

    def __init__(self, repository: Path, models: tuple[str, ...]) -> None:
        self.repository = repository
        self.models = models
        self.child: ChildProcess | None = None
        self.http_url = self.grpc_url = self.metrics_url = ""

    def __enter__(self) -> RefServer:
        self.child = ChildProcess(
            [sys.executable, "-m", "tests.load.refserver", str(self.repository), *self.models],
            None,  # stderr stays this process's, as pytest shows it
            child_env(),
            stdin_pipe=True,
        )
        try:
            addresses = self.child.wait_ready(120.0)
        except AssertionError as exc:
            self.__exit__(None, None, None)
            raise RuntimeError(f"reference server exited before it was ready: {exc}") from exc
        self.http_url, self.grpc_url = addresses.http_url, addresses.grpc_url
        self.metrics_url = addresses.metrics_url
        return self

    def pause(self, model: str, seconds: float) -> None:
        """Hold the model's executions for ``seconds`` (returns once the pause is in effect)."""
        assert self.child is not None
        self.child.send(f"pause {model} {seconds}")
        self.child.wait_line("paused", 30.0)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        child, self.child = self.child, None
        if child is not None:
            child.close_stdin()  # EOF: the child stops its server and exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(15)
            child.stop()  # SIGKILL if it did not


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
