"""``kill -9`` of ``perfsweep ui`` takes its managed reference server and Locust processes down.

Nothing in the killed process gets to clean up, so what stops the children is the launch itself
(``PR_SET_PDEATHSIG`` from :func:`analyzer.target.supervise.child_process_options`, and the server's
``PERFSWEEP_PARENT_PID`` watchdog). The children are read from ``/proc`` before the kill, the
server's pid also from its log line, and each is polled until it is gone.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.support.servers import supervised_pid
from tests.ui.support import (
    UI_READY,
    Child,
    children_of,
    http,
    perfsweep,
    process_gone,
    wait_all_gone,
    wait_until,
)

pytestmark = [
    pytest.mark.usefixtures("spawns"),
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="children are read from /proc"),
]


def _server_pid(log: Path) -> int | None:
    return supervised_pid(log.read_text(errors="replace")) if log.exists() else None


def test_kill_9_of_ui_takes_the_server_and_locust_workers_down(tmp_path: Path) -> None:
    log_dir = tmp_path / "ui"
    child = Child(
        perfsweep(
            "ui",
            "--model",
            "resnet50",
            "--device",
            "sim",
            "--workers",
            "2",
            "--web-port",
            "0",
            "--log-dir",
            str(log_dir),
        ),
        tmp_path / "ui.log",
    )
    try:
        line = child.wait_line(UI_READY, 180)
        base = re.search(r"(http://\S+?)/ ", line + " ")
        assert base, line
        # Every process exists before the kill: the workers have joined the master.
        wait_until(
            lambda: http("GET", base.group(1) + "/worker-count")[1].get("worker_count") == 2,
            60,
            "two Locust workers",
        )
        server_pid = _server_pid(log_dir / "server.log")
        assert server_pid is not None, "no server pid line in the managed server's log"
        children = children_of(child.proc.pid)
        argvs = [command.split() for command in children.values()]
        assert server_pid in children, children
        assert sum("reference_server" in a for a in argvs) == 1, children
        assert sum("locust" in a and "--worker" in a for a in argvs) == 2, children
        assert sum("locust" in a and "--master" in a for a in argvs) == 1, children

        os.kill(child.proc.pid, signal.SIGKILL)  # perfsweep ui only: nothing gets to clean up
        child.proc.wait(30)
        wait_all_gone(children, 15, "children of the killed perfsweep ui")
        assert process_gone(server_pid)
    finally:
        child.stop()  # SIGKILLs whatever is left in its process group
