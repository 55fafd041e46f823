"""What the suite counts as a live ``perfsweep run`` (tests/support/live_sweeps.py)."""

from __future__ import annotations

import pytest

from tests.support.live_sweeps import is_live_run
from tests.support.sweeps import CLI


@pytest.mark.parametrize(
    ("args", "live"),
    [
        ([*CLI, "run", "--model", "resnet50"], True),
        (["perfsweep", "run", "--resume", "reports/x"], True),
        ([*CLI, "run", "--server", "virtual", "--model", "resnet50"], False),
        ([*CLI, "load", "--url", "http://127.0.0.1:1"], False),
        (["perfsweep", "serve", "--model", "resnet50"], False),
        (["python", "-m", "reference_server"], False),
        ("perfsweep run --model resnet50", False),  # a shell string: not how tests start it
    ],
)
def test_a_live_run_is_perfsweep_run_not_in_virtual_time(args: object, live: bool) -> None:
    assert is_live_run(args) is live
