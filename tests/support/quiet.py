"""Tests that hold a timing to a tight bound run alone, while the rest of the suite runs on every
core.

Most tests do not care how busy the machine is: a sweep that must finish, a server that must
answer, a record that must round-trip. A few assert something measured on this machine against a
tight bound (a p99 goal at high load, the simulator beside the server it predicts, the
generator's own send lag), and another test's sweep on the second core is load they would read
as their own. Such a test requests :func:`quiet_machine` (``tests/conftest.py``), which marks it
``quiet``. Where a run puts tests on xdist workers (``pytest -n auto tests/load``; ``make
test-fast``; or two passes, ``-m "not quiet" -n auto`` then ``-m quiet``), this plugin keeps the
quiet ones alone:

- every test holds the machine *shared* from its setup to its teardown, a ``quiet`` test holds
  it *exclusive*: it starts once the other workers' running tests have ended, and no other test
  starts until it has ended;
- every test first passes a turnstile (a second lock, held only while it waits for the machine),
  so a waiting ``quiet`` test is not overtaken by tests that keep starting on the other worker.

The locks are ``flock`` locks on two files in a folder the controller makes, hands to each
worker and removes at the end. Without xdist (a single process) nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

#: The marker of tests that run alone; set by the ``quiet_machine`` fixture, never by hand.
QUIET_MARKER = "quiet"
QUIET_FIXTURE = "quiet_machine"
LOCK_FOLDER = "perfsweep_quiet_folder"


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


class QuietMachine:
    """A pytest plugin: the readers-writer lock around each test under pytest-xdist."""

    def __init__(self, config: pytest.Config) -> None:
        worker_input = getattr(config, "workerinput", None)
        #: The folder of the two lock files: made by the controller, passed to each worker.
        self.folder: Path | None = None
        self._owned = False
        if worker_input is not None and LOCK_FOLDER in worker_input:
            self.folder = Path(worker_input[LOCK_FOLDER])

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: object) -> None:
        # The controller, once per worker it starts.
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix="perfsweep-quiet-"))
            self._owned = True
        node.workerinput[LOCK_FOLDER] = str(self.folder)  # type: ignore[attr-defined]

    @pytest.hookimpl(tryfirst=True, wrapper=True)  # outside pytest-timeout: waiting is not a hang
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        if self.folder is None or self._owned:
            return (yield)
        quiet = item.get_closest_marker(QUIET_MARKER) is not None
        with contextlib.ExitStack() as held:
            with _flock(self.folder / "turnstile", fcntl.LOCK_EX):
                held.enter_context(
                    _flock(self.folder / "machine", fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
                )
            return (yield)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._owned and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
