"""A restarted managed reference server comes back on the ports it had, so the load generator
(built once on the target's url) reaches it again; when those ports are taken, on free ones."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from analyzer.target.managed import ManagedServer
from tests.support.servers import wait_until
from tests.sweep.test_e2e_sim import make_repo

pytestmark = pytest.mark.usefixtures("spawns")


def test_a_restart_comes_back_on_the_same_ports_or_on_free_ones(tmp_path: Path) -> None:
    server = ManagedServer(
        "tiny", "sim", tmp_path / "server" / "server.log", repository=make_repo(tmp_path)
    )
    server.start()
    try:
        url, first = server.url, server.addresses
        pid = server.pid()
        assert pid is not None and first is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not server.alive(), 10, "the killed server to be seen dead")
        server.ensure_alive()
        assert server.url == url and server.addresses == first and server.restarts == 1
        # Its HTTP port taken meanwhile: a server on free ports beats none.
        pid = server.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not server.alive(), 10, "the killed server to be seen dead")
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
            squatter.bind(("127.0.0.1", first.http_port))
            squatter.listen()
            server.ensure_alive()
            assert server.url != url and server.alive() and server.restarts == 2
    finally:
        server.stop()
