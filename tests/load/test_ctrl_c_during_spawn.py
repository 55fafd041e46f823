"""A Ctrl-C while Locust spawns users interrupts the measurement (Locust's runners swallow it).

Locust's ``LocalRunner`` spawns users in a greenlet that catches ``KeyboardInterrupt`` and
quits the runner; a Ctrl-C that came then was lost and a sweep measured on.
:func:`analyzer.load.backends.start_users` holds SIGINT until the spawn has finished and raises it.
The engine is gevent-patched, so each case runs in its own process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("spawns")

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import analyzer.load._gevent  # patch first
    import os, signal, sys
    import gevent
    from locust import User, constant, task
    from locust.env import Environment
    from analyzer.load.backends import start_users

    class Idle(User):
        wait_time = constant(10)

        @task
        def nothing(self):
            pass

    users, interrupt = int(sys.argv[1]), sys.argv[2] == "1"
    runner = Environment(user_classes=[Idle]).create_local_runner()
    if interrupt:
        # At most 1000 users a second: 3000 take ~3 s to spawn; SIGINT comes inside it.
        gevent.spawn_later(0.05, os.kill, os.getpid(), signal.SIGINT)
    try:
        start_users(runner, Idle, users)
        print("returned", runner.user_count)
    except KeyboardInterrupt:
        print("interrupted", runner.user_count)
    print("handler restored", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    runner.quit()
    """
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("users", "interrupt", "expected"),
    [(3000, True, "interrupted 3000"), (20, False, "returned 20")],
)
def test_a_ctrl_c_during_the_spawn_is_raised_after_it(
    users: int, interrupt: bool, expected: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(users), "1" if interrupt else "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    # The spawn finished (nothing quit half-way) and the interrupt came after it.
    assert expected in lines, done.stdout + done.stderr[-2000:]
    assert "handler restored True" in lines
