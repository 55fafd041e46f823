"""The ``io`` marker's guard: an unmarked test that starts a process or opens a socket fails.

``make test-fast`` runs ``pytest -m "not io and not slow"``: the tests that need no server,
child process or socket, in seconds. A test is marked ``io`` by the fixtures it requests, never by hand:
``tests/conftest.py`` marks every test whose fixture closure holds :data:`IO_FIXTURES`
(``spawns`` or ``serves``), and every fixture that starts a server or a process requests one of
them. This module keeps that marking honest: while an unmarked test runs (setup, call and
teardown, so also the session fixtures it pulls in), these raise :class:`UnmarkedIoError`:

- processes: ``subprocess.Popen`` (so ``run``/``check_output``/``os.popen`` and asyncio's
  subprocesses), ``os.fork``, ``os.forkpty``, ``os.posix_spawn[p]``, ``os.system`` and
  ``multiprocessing``'s ``Process.start`` (every start method, pools included);
- sockets: ``socket.socket.bind``, ``connect`` and ``connect_ex``, every address family.
  AF_UNIX is not exempt: no unmarked test needs it, and a Unix socket is as much a server as
  a TCP one (``socket.socketpair``, which asyncio's event loop uses, needs neither call).

The guard is on in every run, ``make test`` included, so a test that does I/O without the
fixture fails where it is written instead of quietly slowing the fast tier. An error the code
under test swallows (``except Exception``) still fails the test: each violation is recorded and
a phase that would have passed is reported failed with it.

Not seen by the guard: sockets that C libraries open without Python's ``socket`` module, such
as the gRPC core and libpq (an Optuna ``postgresql://`` storage). Every gRPC server in these
tests is started by a reference server, which also binds its HTTP port through ``socket``, or
by a child process; the one unit test that opens a PostgreSQL URL requests ``serves``.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing.process
import os
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The marker of tests that start a server, spawn a process or open a socket.
IO_MARKER = "io"
#: Requesting one of these (directly or through another fixture) marks a test ``io``.
SPAWNS = "spawns"
SERVES = "serves"
IO_FIXTURES = frozenset({SPAWNS, SERVES})


class UnmarkedIoError(RuntimeError):
    """A test that is not marked ``io`` started a process or opened a socket."""


def guarded_calls() -> list[tuple[Any, str, str]]:
    """``(owner, attribute, fixture to request)`` for every call the guard intercepts."""
    calls: list[tuple[Any, str, str]] = [
        (subprocess.Popen, "__init__", SPAWNS),
        (os, "fork", SPAWNS),
        (os, "forkpty", SPAWNS),
        (os, "system", SPAWNS),
        (multiprocessing.process.BaseProcess, "start", SPAWNS),
        (socket.socket, "bind", SERVES),
        (socket.socket, "connect", SERVES),
        (socket.socket, "connect_ex", SERVES),
    ]
    calls += [(os, name, SPAWNS) for name in ("posix_spawn", "posix_spawnp") if hasattr(os, name)]
    return calls


class IoGuard:
    """The pytest plugin: wraps :func:`guarded_calls` for the session, checks each test.

    Registered by ``tests/conftest.py``; ``blocked_for`` is the node id of the unmarked test now
    running (``None`` between tests and while an ``io`` test runs). Calls from the main thread
    and from threads started during the test count (a reference server binds its ports in its
    own thread); threads that were running before it began (a session server that an ``io``
    test started) are not the test's doing.
    """

    def __init__(self) -> None:
        self.blocked_for: str | None = None
        #: Threads already running when the current test started, but for the main thread.
        self._old_threads: set[threading.Thread] = set()
        self.violations: list[str] = []
        self._lock = threading.Lock()
        self._originals: list[tuple[Any, str, Any]] = []

    # -- the wrappers --------------------------------------------------------------------

    def install(self) -> None:
        for owner, name, fixture in guarded_calls():
            original = getattr(owner, name)
            self._originals.append((owner, name, original))
            setattr(owner, name, self._wrap(original, f"{_owner_name(owner)}.{name}", fixture))

    def uninstall(self) -> None:
        while self._originals:
            owner, name, original = self._originals.pop()
            setattr(owner, name, original)

    def _wrap(self, original: Callable[..., Any], what: str, fixture: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            nodeid = self.blocked_for
            if nodeid is not None and threading.current_thread() not in self._old_threads:
                message = (
                    f"{nodeid} called {what} (from {_caller()}) but is not marked "
                    f"{IO_MARKER!r}: request the "
                    f"{fixture!r} fixture (in the test's or a fixture's arguments, or "
                    f'pytestmark = pytest.mark.usefixtures("{fixture}")); it marks the test '
                    f"{IO_MARKER!r}, which keeps it out of `make test-fast`"
                )
                with self._lock:
                    self.violations.append(message)
                raise UnmarkedIoError(message)
            return original(*args, **kwargs)

        return guarded

    @contextlib.contextmanager
    def expect_violation(self, fixture: str) -> Iterator[pytest.ExceptionInfo[UnmarkedIoError]]:
        """For the guard's own tests: the block must raise the error that names ``fixture``;
        that violation is then not held against the test."""
        with pytest.raises(UnmarkedIoError, match=f"request the {fixture!r} fixture") as info:
            yield info
        with self._lock:
            self.violations.remove(str(info.value))

    # -- the hooks -----------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        marked = item.get_closest_marker(IO_MARKER) is not None
        self._old_threads = set(threading.enumerate()) - {threading.main_thread()}
        self.blocked_for = None if marked else item.nodeid
        try:
            return (yield)
        finally:
            self.blocked_for = None
            self._old_threads = set()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        with self._lock:
            violations, self.violations = self.violations, []
        if violations and report.passed:
            # The code under test caught the UnmarkedIoError; the test must not pass anyway.
            report.outcome = "failed"
            report.longrepr = "\n".join(dict.fromkeys(violations))
        return report


def _caller(depth: int = 3) -> str:
    """The innermost frames of this repository's code (not the standard library's or a
    package's) that led to the guarded call: where to look when the error was swallowed."""
    frames: list[str] = []
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None and len(frames) < depth:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(REPO_ROOT) and not path.is_relative_to(REPO_ROOT / ".venv"):
            frames.append(f"{path.relative_to(REPO_ROOT)}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(frames) or "outside this repository"


def _owner_name(owner: Any) -> str:
    if owner is os:
        return "os"
    if owner is multiprocessing.process.BaseProcess:
        return "multiprocessing.Process"
    return f"{owner.__module__}.{owner.__qualname__}"
