"""How many ``perfsweep run`` processes the suite starts against live servers, printed at the end.

A live sweep costs minutes; a sweep in virtual time (``--server virtual``, in the test process)
seconds. This plugin counts every child process that runs ``perfsweep run`` (the console script,
or ``analyzer.cli`` through ``python -c``) other than a virtual one, by the test that started
it, so the next live sweep is seen when it lands. Tests marked ``live`` sweep (they measure);
any other test's ``perfsweep run`` is refused before its first trial (a few seconds: a bad
flag, a model that cannot be tuned, a server that refuses the credentials), and the table
counts them apart.
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
        #: The tests marked ``live`` that started one.
        self.live: set[str] = set()
        self._current_live = False
        self._original = subprocess.Popen.__init__

    def install(self) -> None:
        plugin, original = self, self._original

        def counting_init(popen: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
            if is_live_run(args):
                plugin.by_test[plugin._current or "(outside a test)"] += 1
                if plugin._current_live:
                    plugin.live.add(plugin._current)
            original(popen, args, *rest, **kw)

        subprocess.Popen.__init__ = counting_init  # type: ignore[method-assign]

    def uninstall(self) -> None:
        subprocess.Popen.__init__ = self._original  # type: ignore[method-assign]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        self._current = item.nodeid
        self._current_live = item.get_closest_marker(LIVE_MARKER) is not None
        try:
            return (yield)
        finally:
            self._current, self._current_live = "", False

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.by_test:
            return
        sweeps = sum(n for test, n in self.by_test.items() if test in self.live)
        refused = sum(self.by_test.values()) - sweeps
        terminalreporter.write_sep(
            "=",
            f"perfsweep run processes: {sweeps} sweeping a live server, "
            f"{refused} refused before a trial",
        )
        for test, count in sorted(self.by_test.items()):
            kind = "sweep" if test in self.live else "refused"
            terminalreporter.write_line(f"{count:3d}  {kind:<8} {test}")
