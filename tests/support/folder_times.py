"""Wall time per test folder, printed at the end of every run (the suite's cost, where it is).

Each test's setup, call and teardown durations are summed under its first folder below
``tests/`` (``tests/sweep/test_e2e_sim.py::x`` counts for ``sweep``). Module- and
session-scoped fixtures are charged to the test that first requested them, as pytest reports
them.
"""

from __future__ import annotations

from collections import defaultdict

import pytest


def folder_of(nodeid: str) -> str:
    """The first folder below ``tests/`` of a node id (``"."`` for a test at the top)."""
    parts = nodeid.split("::", 1)[0].split("/")
    if parts and parts[0] == "tests":
        parts = parts[1:]
    return parts[0] if len(parts) > 1 else "."


class FolderTimes:
    """A pytest plugin: sums report durations per folder and prints a table at the end."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.tests: defaultdict[str, set[str]] = defaultdict(set)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        folder = folder_of(report.nodeid)
        self.seconds[folder] += report.duration
        self.tests[folder].add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        total = sum(self.seconds.values())
        terminalreporter.write_sep("=", "time per test folder")
        for folder, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(
                f"{folder:<14} {seconds:8.1f} s  {len(self.tests[folder]):5d} tests"
            )
        terminalreporter.write_line(f"{'total':<14} {total:8.1f} s")
