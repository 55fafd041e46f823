"""The generator processes the controller drives, behind one ``_Backend`` protocol.

* ``LocalBackend``: Locust's ``LocalRunner`` in this process (``workers=1``);
* ``DistributedBackend``: Locust's ``MasterRunner`` here plus N ``python -m analyzer.load.worker``
  subprocesses on loopback (``workers=N``), or remote workers that connect to ``--master``.

:func:`start_users` holds SIGINT until a spawn has finished, then raises it.
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import gevent
from gevent.event import Event
from locust.env import Environment
from locust.runners import STATE_STOPPED, MasterRunner

from analyzer.errors import TargetError
from analyzer.load.context import EngineConfig, ProcessContext, attach_context
from analyzer.load.recorder import Tick
from analyzer.load.users import USER_CLASSES


class _Backend(Protocol):
    processes: int

    def configure(self, config: EngineConfig) -> None: ...
    def start(self, user_class: type, users: int) -> None: ...
    def collect(self) -> Tick: ...
    def stop_sending(self) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...


def start_users(runner: Any, user_class: type, users: int) -> None:
    """``runner.start`` for ``users`` of ``user_class``, keeping a Ctrl-C that comes meanwhile.

    Locust's runners catch a ``KeyboardInterrupt`` raised while they spawn users and quit the
    runner instead (``locust/runners.py``: "We need to catch keyboard interrupt ..."), in
    ``MasterRunner.start`` itself and in ``LocalRunner``'s spawning greenlet: a Ctrl-C there was
    lost, and the sweep measured on (seen twice in full-suite runs of
    ``tests/sweep/test_real_triton.py::test_ctrl_c_leaves_the_original_config``, exit 0 after
    every trial). SIGINT is held until the spawn has finished and raised here then. Off the
    main thread (where no signal handler can be set) it is a plain start.
    """
    rate = min(max(users, 1) * 4, 1000)
    held: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    except ValueError:  # not the main thread
        runner.start(users, spawn_rate=rate, user_classes=[user_class])
        return
    try:
        runner.start(users, spawn_rate=rate, user_classes=[user_class])
        spawning = getattr(runner, "spawning_greenlet", None)
        if spawning is not None:
            spawning.join()
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
    if held:
        raise KeyboardInterrupt


class LocalBackend:
    """All users in this process (Locust ``LocalRunner``)."""

    processes = 1

    def __init__(self) -> None:
        self.env = Environment(user_classes=list(USER_CLASSES))
        self.ctx = ProcessContext(0)
        attach_context(self.env, self.ctx)
        self.runner = self.env.create_local_runner()

    def configure(self, config: EngineConfig) -> None:
        self.ctx.configure(config)

    def start(self, user_class: type, users: int) -> None:
        start_users(self.runner, user_class, users)

    def collect(self) -> Tick:
        return self.ctx.recorder.take_local_tick()

    def stop_sending(self) -> None:
        self.ctx.stop_sending()

    def stop(self) -> None:
        self.runner.stop()

    def close(self) -> None:
        try:
            self.runner.quit()
        finally:
            self.ctx.close()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host not in ("*", "") else "127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class DistributedBackend:
    """Locust master here; workers are local subprocesses or remote ``perfsweep load --worker``."""

    def __init__(
        self, spawn: int, expect_remote: int = 0, bind_host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.processes = spawn + expect_remote
        self.env = Environment(user_classes=list(USER_CLASSES))
        self.port = port or _free_port(bind_host)
        runner = self.env.create_master_runner(bind_host, self.port)
        assert isinstance(runner, MasterRunner)
        self.runner = runner
        self._replies: dict[str, dict[str, Any]] = {}
        self._seq = 0
        self._got_all = Event()
        #: Workers whose request handler is registered (their ``ps_ready``): a worker counts
        #: as connected a moment before it can take a request, and a request sent in between
        #: is dropped ("Unknown message type"), so requests wait for this instead.
        self._ready: set[str] = set()
        self.runner.register_message("ps_reply", self._on_reply)
        self.runner.register_message("ps_ready", self._on_ready)
        self.procs: list[subprocess.Popen[bytes]] = []
        host = "127.0.0.1" if bind_host in ("*", "", "0.0.0.0") else bind_host
        for index in range(spawn):
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "analyzer.load.worker",
                        "--master-host",
                        host,
                        "--master-port",
                        str(self.port),
                        "--index",
                        str(index + 1),
                    ],
                    env={**os.environ, "PYTHONPATH": _pythonpath()},
                )
            )
        deadline = time.monotonic() + 60.0
        while len(self._ready) < self.processes:
            if time.monotonic() > deadline:
                self.close()
                raise TargetError(
                    f"only {len(self._ready)} of {self.processes} Locust workers connected "
                    f"to the master on port {self.port} within 60 s; check the worker command lines"
                )
            if any(p.poll() is not None for p in self.procs):
                self.close()
                raise TargetError("a Locust worker process exited during start-up; see its output")
            gevent.sleep(0.1)

    def _on_ready(self, environment: Environment, msg: Any, **_: Any) -> None:
        self._ready.add(msg.node_id)

    def _on_reply(self, environment: Environment, msg: Any, **_: Any) -> None:
        data = msg.data
        if data.get("seq") == self._seq:
            self._replies[msg.node_id] = data
            if len(self._replies) >= self.processes:
                self._got_all.set()

    def _round_trip(self, kind: str, payload: dict[str, Any], timeout_s: float) -> list[dict]:
        self._seq += 1
        self._replies = {}
        self._got_all.clear()
        # One message per worker, each with a distinct index (seeds of arrivals and data).
        for index, client_id in enumerate(sorted(self.runner.clients), start=1):
            message = {"kind": kind, "seq": self._seq, "index": index, **payload}
            self.runner.send_message("ps_request", message, client_id=client_id)
        if not self._got_all.wait(timeout_s):
            raise TargetError(
                f"{len(self._replies)} of {self.processes} Locust workers answered {kind!r} "
                f"within {timeout_s:g} s; a worker is stuck or gone"
            )
        return list(self._replies.values())

    def configure(self, config: EngineConfig) -> None:
        for reply in self._round_trip("configure", {"config": config.to_dict()}, 60.0):
            if reply.get("error"):
                raise TargetError(f"a Locust worker could not configure: {reply['error']}")

    def start(self, user_class: type, users: int) -> None:
        start_users(self.runner, user_class, users)

    def collect(self) -> Tick:
        return Tick.merge(r["tick"] for r in self._round_trip("tick", {}, 10.0))

    def stop_sending(self) -> None:
        self._round_trip("stop_sending", {}, 10.0)

    def stop(self) -> None:
        self.runner.stop()
        deadline = time.monotonic() + 30.0
        while self.runner.state != STATE_STOPPED and time.monotonic() < deadline:
            gevent.sleep(0.05)

    def close(self) -> None:
        try:
            self.runner.quit()
        finally:
            for p in self.procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def _pythonpath() -> str:
    root = str(Path(__file__).resolve().parents[2])
    existing = os.environ.get("PYTHONPATH", "")
    return root + (os.pathsep + existing if existing else "")
