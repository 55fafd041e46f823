"""How many ``perfsweep run`` processes the suite starts against live servers, printed at the end.

A live sweep costs minutes; a sweep in virtual time (``--server virtual``, in the test process)
seconds. This plugin counts every child process that runs ``perfsweep run`` (the console script,
or ``analyzer.cli`` through ``python -c``) other than a virtual one, by the test that started
it, so the next live sweep is seen when it lands. Each is either a sweep (it measures) or a run
refused before its first trial (a few seconds): the count does not tell them apart, the table
names the tests.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

#: The marker of tests that run ``perfsweep run`` against a live server; set by the
#: ``live_sweep`` fixture (``tests/conftest.py``), never by hand.
LIVE_MARKER = "live"
LIVE_FIXTURE = "live_sweep"


def is_live_run(args: Any) -> bool:
    """Whether a child's argument list starts ``perfsweep run`` not in virtual time."""
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        return False
    words = [str(a) for a in args]
    cli = next(
        (i for i, w in enumerate(words) if w.endswith("perfsweep") or "analyzer.cli" in w), None
    )
    if cli is None or "run" not in words[cli + 1 : cli + 2]:
        return False
    return not any(
        w == "--server" and words[i + 1 : i + 2] == ["virtual"] for i, w in enumerate(words)
    )


class LiveSweeps:
    """A pytest plugin: counts live ``perfsweep run`` children per test and prints them."""

    def __init__(self) -> None:
        self.by_test: Counter[str] = Counter()
        self._current = ""
        self._original = subprocess.Popen.__init__

    def install(self) -> None:
        plugin, original = self, self._original

        def counting_init(popen: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
            if is_live_run(args):
                plugin.by_test[plugin._current or "(outside a test)"] += 1
            original(popen, args, *rest, **kw)

        subprocess.Popen.__init__ = counting_init  # type: ignore[method-assign]

    def uninstall(self) -> None:
        subprocess.Popen.__init__ = self._original  # type: ignore[method-assign]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        self._current = item.nodeid
        try:
            return (yield)
        finally:
            self._current = ""

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.by_test:
            return
        total = sum(self.by_test.values())
        terminalreporter.write_sep("=", f"perfsweep run against live servers: {total} processes")
        for test, count in sorted(self.by_test.items()):
            terminalreporter.write_line(f"{count:3d}  {test}")
