"""``make test``: lint, types and the test suite in tiers, each timed, a table at the end.

Run as ``python -m tests.tiers`` from the repository root (``make test`` does). Every tier runs
even when one before it failed, so one run shows everything that is wrong; the exit status is
the first failure's. The tiers, cheapest first:

=========== ==================================================================================
lint        ``ruff check`` and ``ruff format --check``
types       ``mypy`` (the files of ``[tool.mypy]``)
docs        ``mkdocs build --strict`` (``make docs``): a broken link or anchor fails it
unit        tests that start no process and open no socket (``not io``): pure logic, planted
            fakes, sweeps in virtual time; on every core (pytest-xdist)
integration real servers, processes and sockets (``io``), neither ``quiet`` nor ``live``;
            one file per worker on every core (``--dist loadfile``: a file's server fixtures
            stay in one process)
quiet       tests that hold a measured latency or rate to a tight bound: alone, one at a time
live        ``perfsweep run`` against a live reference server or Triton: alone, one at a time
=========== ==================================================================================

The last line is the whole suite's count, ``N passed, N failed`` (pytest's own closing line
of each tier is above it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Tier:
    name: str
    command: tuple[str, ...]
    #: A pytest tier: its counts are read from its JUnit XML.
    pytest: bool = False
    #: Environment variables set for this tier's command, on top of the tiers' own.
    env: tuple[tuple[str, str], ...] = ()


def tiers(workers: str) -> list[Tier]:
    def pytest(marks: str, *extra: str) -> tuple[str, ...]:
        return (str(BIN / "pytest"), "-m", marks, *extra)

    return [
        Tier("lint", (str(BIN / "ruff"), "check", ".")),
        Tier("format", (str(BIN / "ruff"), "format", "--check", ".")),
        Tier("types", (str(BIN / "mypy"),)),
        # Material prints a banner about MkDocs 2 on every build; it is no warning of the site's.
        Tier(
            "docs",
            (str(BIN / "mkdocs"), "build", "--strict"),
            env=(("NO_MKDOCS_2_WARNING", "1"),),
        ),
        Tier("unit", pytest("not io and not quiet", "-n", workers), True),
        Tier(
            "integration",
            pytest("io and not quiet and not live", "-n", workers, "--dist", "loadfile"),
            True,
        ),
        Tier("quiet", pytest("quiet"), True),
        Tier("live", pytest("live and not quiet"), True),
    ]


@dataclass
class Outcome:
    tier: Tier
    code: int
    seconds: float
    passed: int = 0
    failed: int = 0
    skipped: int = 0


def counts(junit: Path) -> tuple[int, int, int]:
    """Passed, failed (errors included) and skipped tests of one JUnit XML file."""
    if not junit.exists():
        return 0, 0, 0
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return total - failed - skipped, failed, skipped


def run(tier: Tier, scratch: Path) -> Outcome:
    command = list(tier.command)
    junit = scratch / f"{tier.name}.xml"
    if tier.pytest:
        command.append(f"--junitxml={junit}")
    print(f"\n=== tier {tier.name}: {' '.join(command)}", flush=True)
    t0 = time.monotonic()
    code = subprocess.call(command, env={**os.environ, **dict(tier.env)})
    outcome = Outcome(tier, code, time.monotonic() - t0)
    if tier.pytest:
        outcome.passed, outcome.failed, outcome.skipped = counts(junit)
        if code == 5:  # pytest: no test collected. Every tier has tests; none is a failure.
            print(f"tier {tier.name} collected no test", flush=True)
    return outcome


def main() -> int:
    workers = os.environ.get("PERFSWEEP_TEST_WORKERS", "auto")
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="perfsweep-tiers-") as scratch:
        for tier in tiers(workers):
            outcomes.append(run(tier, Path(scratch)))
    print("\n=== time per tier")
    for o in outcomes:
        figures = (
            f"{o.passed:5d} passed {o.failed:3d} failed {o.skipped:3d} skipped"
            if (o.tier.pytest)
            else ""
        )
        status = "ok" if o.code == 0 else f"FAILED (exit {o.code})"
        print(f"{o.tier.name:<12} {o.seconds:8.1f} s  {status:<16} {figures}")
    print(f"{'total':<12} {sum(o.seconds for o in outcomes):8.1f} s")
    failed = [o for o in outcomes if o.code != 0]
    passed = sum(o.passed for o in outcomes)
    failures = sum(o.failed for o in outcomes)
    skipped = sum(o.skipped for o in outcomes)
    # A tier that failed without a failed test (lint, types, a crash) counts as one failure.
    failures += sum(1 for o in failed if o.failed == 0)
    print(f"{passed} passed, {failures} failed, {skipped} skipped")
    return failed[0].code if failed else 0


if __name__ == "__main__":
    sys.exit(main())
