"""``perfsweep`` inside the test process, for command lines that end before any load.

A child interpreter costs a second or two of imports per command line; an error that is raised
while flags and scenarios are checked needs none of what the child isolates. Only such paths may
run here: a command that reaches the load engine imports Locust, which monkey-patches the process
with gevent (``tests/conftest.py`` fails a test that does), and one that starts a server or opens
a socket belongs in a subprocess test marked ``io``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from rich.console import Console

import analyzer.cli as cli


def perfsweep_in_process(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *args: str,
    columns: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``perfsweep ARGS`` through :func:`analyzer.cli.main` as its console script does.

    The answer has the fields a ``subprocess.run(..., capture_output=True, text=True)`` of the
    same command would have: the exit status ``sys.exit`` was given, and what was written to
    stdout and stderr. No ``PERFSWEEP_*`` variable reaches the command. ``columns``: the terminal
    width (``COLUMNS``), for the error console too, which is otherwise sized at import.
    """
    for key in list(os.environ):
        if key.startswith("PERFSWEEP_"):
            monkeypatch.delenv(key)
    if columns is not None:
        monkeypatch.setenv("COLUMNS", str(columns))
    # Sized as a fresh process sizes it, from the environment above.
    monkeypatch.setattr(cli, "err_console", Console(stderr=True))
    monkeypatch.setattr(sys, "argv", ["perfsweep", *args])
    capsys.readouterr()  # only this command's output
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["perfsweep", *args], code, out, err)
