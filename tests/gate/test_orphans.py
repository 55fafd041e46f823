"""``kill -9`` of a measuring ``perfsweep gate`` takes its managed reference server down.

The gate keeps the server's log in a temporary directory; ``TMPDIR`` points it into the test's
own directory so the log (and its ``--- perfsweep: server pid N`` line) can be read. The gate is
killed once the server has answered inferences, i.e. in the middle of a measurement.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from reference_server.ready import last_ready
from tests.support.servers import supervised_pid
from tests.ui.support import (
    Child,
    child_env,
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

#: Long enough that the kill lands in the measurement: 3 repeats of 0.5 s + 2 windows of 5 s.
SLOW_LOAD = ["--rate-rps", "5", "--warmup-s", "0.5", "--window-s", "5", "--windows", "2"]


def _server_log(tmp: Path) -> tuple[int, str] | None:
    """(server pid, HTTP address) once the managed server's log says it is ready."""
    for log in tmp.glob("perfsweep-gate-*/server/server.log"):
        text = log.read_text(errors="replace")
        pid, ready = supervised_pid(text), last_ready(text)
        if pid and ready:
            return pid, ready.http_url
    return None


def _inferences(address: str) -> int:
    status, stats = http("GET", f"http://{address}/v2/models/resnet50/stats", timeout_s=5)
    return int(stats["model_stats"][0]["inference_count"]) if status == 200 else 0


def test_kill_9_of_a_measuring_gate_takes_its_server_down(tmp_path: Path) -> None:
    gate_tmp = tmp_path / "tmp"
    gate_tmp.mkdir()
    child = Child(
        perfsweep(
            "gate",
            "--model",
            "resnet50",
            "--device",
            "sim",
            "--p99-ms",
            "1000",
            *SLOW_LOAD,
            "--repeats",
            "3",
        ),
        tmp_path / "gate.log",
        env=child_env(TMPDIR=str(gate_tmp)),
    )
    try:
        found = wait_until(
            lambda: child.proc.poll() is None and _server_log(gate_tmp), 180, "the managed server"
        )
        server_pid, address = found
        wait_until(lambda: _inferences(address) > 0, 60, "the gate's first measured requests")
        children = children_of(child.proc.pid)
        assert server_pid in children, children
        assert child.proc.poll() is None, "the gate ended before it could be killed"

        os.kill(child.proc.pid, signal.SIGKILL)  # the gate only: nothing gets to clean up
        child.proc.wait(30)
        wait_all_gone(children, 15, "children of the killed perfsweep gate")
        assert process_gone(server_pid)
    finally:
        child.stop()  # SIGKILLs whatever is left in its process group
