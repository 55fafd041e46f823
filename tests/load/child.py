"""Run a ``tests.load`` module in a child process and read the JSON it prints last.

The load engine is gevent code: it runs in a child (``python -m tests.load.<module>``) so the test
process is never patched. ``tests.load.driver`` (levels through ``LocustLoadGenerator``) and
``tests.load.client_driver`` (hot-path client checks) both answer through :func:`run_module`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_module(
    module: str, *args: str, stdin: str | None = None, timeout_s: float = 240.0
) -> dict[str, Any]:
    """Run ``python -m module args...`` (``stdin`` as its input) and return its last stdout line
    as JSON.

    Raises:
        AssertionError: The child failed (the message holds the tail of its stderr).
    """
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    if done.returncode != 0:
        name = module.rsplit(".", 1)[-1].replace("_", " ")
        raise AssertionError(f"{name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer
