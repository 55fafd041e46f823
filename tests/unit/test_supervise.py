"""Process supervision on its own: a child that writes a ready line, dies early, hangs, or
ignores SIGTERM. Real (tiny) Python children; no server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from analyzer.errors import TargetError
from analyzer.target.supervise import PARENT_PID_ENV, Supervisor, log_note

pytestmark = pytest.mark.usefixtures("spawns")


def child(tmp_path: Path, code: str, **kwargs: str) -> Supervisor:
    return Supervisor([sys.executable, "-u", "-c", code], tmp_path / "log" / "child.log", **kwargs)


def found(marker: str) -> Callable[[str], str | None]:
    """A ``wait_for`` parser: the first line the child wrote that starts with ``marker``."""

    def parse(text: str) -> str | None:
        return next((line for line in text.splitlines() if line.startswith(marker)), None)

    return parse


def test_wait_for_reads_what_the_child_wrote_since_it_started(tmp_path: Path) -> None:
    code = (
        "import os, sys, time; "
        f"print('ready', os.environ['{PARENT_PID_ENV}'], os.environ['EXTRA']); "
        "time.sleep(60)"
    )
    process = child(tmp_path, code, label="thing", env={"EXTRA": "x"})
    process.start()
    try:
        line = process.wait_for(found("ready"), timeout_s=60)
        assert line == f"ready {os.getpid()} x"  # the parent pid the child must not outlive
        assert process.running() and process.pid() is not None
        log = process.log_path.read_text()
        assert f"--- perfsweep: thing pid {process.pid()}" in log
        assert "--- perfsweep: starting " in log
    finally:
        process.stop()
    assert not process.running() and process.pid() is None
    # A second start appends; wait_for only sees the new part of the log.
    log_note(process.log_path, "ready from an old run")
    process.command = [sys.executable, "-u", "-c", "print('fresh'); import time; time.sleep(60)"]
    process.start()
    try:
        assert process.wait_for(found("fresh"), timeout_s=60) == "fresh"
        assert found("ready")(process.log_text()) is None
    finally:
        process.stop()


def test_a_child_that_exits_during_startup_is_named_with_its_last_line(tmp_path: Path) -> None:
    process = child(tmp_path, "import sys; print('boom: no model'); sys.exit(3)", name="the thing")
    process.start()
    with pytest.raises(TargetError, match=r"the thing exited with status 3 during startup: boom"):
        process.wait_for(found("ready"), timeout_s=60)
    assert process.returncode() == 3


def test_a_child_that_never_gets_ready_is_stopped(tmp_path: Path) -> None:
    process = child(tmp_path, "import time; time.sleep(60)", name="the thing")
    process.start()
    with pytest.raises(TargetError, match=r"did not start within 0 s \(log: .*child\.log\)"):
        process.wait_for(found("ready"), timeout_s=0.2)
    assert not process.running()


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignoring', flush=True); time.sleep(60)"
    )
    process = child(tmp_path, code)
    process.start()
    process.wait_for(found("ignoring"), timeout_s=60)
    pid = process.pid()
    process.stop(timeout_s=0.5)
    assert pid is not None and not process.running()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: SIGKILL after SIGTERM was ignored


def test_restart_notes_the_death_and_starts_a_new_process(tmp_path: Path) -> None:
    process = child(tmp_path, "import sys; print('ready'); sys.exit(5)", label="thing")
    process.start()
    first = process.pid()
    with pytest.raises(TargetError, match="status 5"):  # it exits right after its line
        process.wait_for(lambda text: None, timeout_s=60)
    process.command = [sys.executable, "-u", "-c", "print('ready'); import time; time.sleep(60)"]
    process.restart()
    try:
        assert process.wait_for(found("ready"), timeout_s=60) == "ready"
        assert process.pid() != first and process.running()
        assert "--- perfsweep: thing died (status 5); restarting" in process.log_path.read_text()
    finally:
        process.stop()


#: The order ``perfsweep run`` imports in: the target modules (this one among them) first, then
#: the load generator, which patches threading for gevent, then a predict phase's pool.
POOL_AFTER_GEVENT = """
import analyzer.target.supervise as supervise
from gevent import monkey
monkey.patch_all()
with supervise.worker_pool(2) as pool:
    print(sum(pool.map(abs, [-1, -2, -3, -4])))
"""


def test_a_worker_pool_made_after_gevent_patched_threading_finishes() -> None:
    # concurrent.futures.process imported before the patch held real OS locks that its patched
    # manager thread deadlocked on: the run slept forever after its baseline.
    done = subprocess.run(
        [sys.executable, "-c", POOL_AFTER_GEVENT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["10"]
