"""``quiet_machine``: under pytest-xdist a quiet test runs while no other test does, and the
other tests still run side by side (``tests/support/quiet.py``).

A real inner pytest run with two xdist workers: each test records when it ran (the system's
monotonic clock, one clock for every process), and the intervals are compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_io_guard import INNER_CONFTEST

REPO_ROOT = Path(__file__).resolve().parents[2]


INNER_TESTS = """
import json, os, time
from pathlib import Path

import pytest

def record(name):
    start = time.monotonic()
    time.sleep(0.4)
    with Path(os.environ["QUIET_LOG"]).open("a") as log:
        log.write(json.dumps([name, start, time.monotonic()]) + "\\n")

@pytest.mark.parametrize("n", range(8))
def test_shared(n):
    record(f"shared{n}")

@pytest.mark.parametrize("n", range(2))
def test_quiet(n, quiet_machine):
    record(f"quiet{n}")
"""

PYPROJECT = """
[tool.pytest.ini_options]
addopts = "--strict-markers -p no:cacheprovider"
markers = ["io: ...", "slow: ...", "quiet: ..."]
"""


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_a_quiet_test_runs_alone_and_the_others_side_by_side(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, spawns: None
) -> None:
    log = pytester.path / "intervals.jsonl"
    monkeypatch.setenv("QUIET_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makepyfile(INNER_TESTS)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "load", "-p", "xdist")
    result.assert_outcomes(passed=10)
    runs = {
        name: (start, end) for name, start, end in map(json.loads, log.read_text().splitlines())
    }
    quiet = [name for name in runs if name.startswith("quiet")]
    shared = [name for name in runs if name.startswith("shared")]
    assert len(quiet) == 2 and len(shared) == 8
    for name in quiet:
        others = [o for o in runs if o != name and overlap(runs[name], runs[o])]
        assert others == [], f"{name} ran beside {others}: {runs}"
    # The lock serialises only the quiet tests: the others still use both workers.
    side_by_side = [(a, b) for a in shared for b in shared if a < b and overlap(runs[a], runs[b])]
    assert side_by_side, f"no two shared tests ran at once: {runs}"


def test_a_quiet_mark_set_by_hand_is_refused(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, spawns: None
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makepyfile("import pytest\n\n@pytest.mark.quiet\ndef test_by_hand(): pass\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'quiet' or 'live' by hand, not through a fixture*test_by_hand*"])
