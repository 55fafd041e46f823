"""What `perfsweep run` prints besides the tables (pure)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from analyzer.commands.run_view import ceiling_note
from analyzer.config.scenario import load_scenario


def outcome(rps: float, met: bool = True) -> Any:
    return SimpleNamespace(best=SimpleNamespace(throughput_rps=rps, meets_goals=met))


def test_a_best_at_the_rate_ceiling_is_called_a_lower_bound() -> None:
    scenario = load_scenario(None, {"traffic.max_rate_rps": 600.0}, env={})
    note = ceiling_note(outcome(600.0), scenario)
    assert note is not None and "at least" in note and "600 req/s" in note
    assert ceiling_note(outcome(540.0), scenario) is None  # a failing rate bounded it
    assert ceiling_note(outcome(600.0, met=False), scenario) is None
    assert ceiling_note(SimpleNamespace(best=None), scenario) is None
    closed = load_scenario(None, {"traffic.mode": "concurrency"}, env={})
    assert ceiling_note(outcome(2000.0), closed) is None  # users, not a rate ceiling
