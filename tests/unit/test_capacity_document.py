"""The document ``perfsweep load --find-capacity --output`` writes, on a planted server.

``find_capacity`` driven by a ``measure`` that meets the goal at every rate up to a known
capacity and misses it above (a one-instance model of 20 ms per execution: 50 req/s), with the
``CapacitySpec`` the load command builds from its flags (``analyzer/commands/load.py``: start
rate 10, the growth left at its default); the result goes through ``load_output_dict`` and JSON
as the command writes it. How close a real search lands to a real capacity is measured in
``benchmarks/capacity_accuracy.py``.
"""

from __future__ import annotations

import json
from typing import Any

from analyzer.measure.capacity import find_capacity
from analyzer.measure.generator import load_output_dict
from analyzer.measure.measurement import Measurement, ServerView
from analyzer.measure.specs import CapacitySpec, Goals, LoadMode, LoadSpec

CAPACITY_RPS = 50.0
GOAL_P99_MS = 200.0
#: Every point's keys a reader of the document relies on.
POINT_KEYS = (
    "mode",
    "target",
    "throughput_rps",
    "p50_ms",
    "p90_ms",
    "p95_ms",
    "p99_ms",
    "request_count",
    "error_count",
    "stable",
    "valid",
    "send_lag_p99_ms",
    "stopped_early",
    "messages",
    "server",
)


def _planted(starved_at: float) -> tuple[list[float], Any]:
    """A ``measure`` of the planted server and the rates it was asked for; its first step at
    ``starved_at`` comes back invalid, as from a generator starved by a busy machine."""
    asked: list[float] = []

    def measure(step: LoadSpec) -> Measurement:
        asked.append(step.target)
        over = step.target > CAPACITY_RPS
        served = min(step.target, CAPACITY_RPS)
        p99_ms = 900.0 if over else 20.0
        return Measurement(
            mode=step.mode,
            target=step.target,
            throughput_rps=served,
            p50_ms=p99_ms / 2,
            p90_ms=p99_ms * 0.9,
            p95_ms=p99_ms * 0.95,
            p99_ms=p99_ms,
            request_count=int(3 * served),
            error_count=0,
            stable=True,
            valid=not (step.target == starved_at and asked.count(starved_at) == 1),
            send_lag_p99_ms=0.2,
            server=ServerView(success_count=int(3 * served), avg_batch_size=1.0),
        )

    return asked, measure


def _document() -> tuple[list[float], dict[str, Any]]:
    # As `perfsweep load --find-capacity --p99-ms 200 --start-rps 10` builds it.
    step = LoadSpec(LoadMode.REQUEST_RATE, 1.0, warmup_s=0.5, window_s=1.5, max_windows=3)
    spec = CapacitySpec(
        goals=Goals(p99_ms=GOAL_P99_MS),
        start_rps=10.0,
        max_rps=100_000.0,
        min_rps=1.0,
        resolution=0.05,
        step=step,
        confirm_failures=True,
    )
    asked, measure = _planted(starved_at=20.0)
    result = find_capacity(spec, measure)
    doc = load_output_dict(list(result.points), result, {"model": "cap"})
    return asked, json.loads(json.dumps(doc))


def test_the_capacity_document_is_versioned_and_names_its_answer() -> None:
    _, doc = _document()
    assert doc["format_version"] == 1 and doc["kind"] == "perfsweep.load"
    capacity = doc["capacity"]
    assert doc["capacity_rps"] == capacity["capacity_rps"]
    assert CAPACITY_RPS * 0.95 <= doc["capacity_rps"] <= CAPACITY_RPS
    assert capacity["bracketed"] is True and capacity["goals"]["p99_ms"] == GOAL_P99_MS
    assert "capacity" in capacity["message"] and "1 step(s) were invalid" in capacity["message"]
    best = capacity["best"]
    assert best["target"] == doc["capacity_rps"] and best["p99_ms"] <= GOAL_P99_MS
    assert best["server"]["avg_batch_size"] == 1.0


def test_bracketing_doubles_from_the_start_rate_and_every_point_is_kept() -> None:
    asked, doc = _document()
    points = doc["capacity"]["points"]
    assert doc["results"] == points
    # Every step run is a point, in order: the invalid one at 20 req/s, then its re-measure.
    assert [p["target"] for p in points] == asked
    assert asked[:4] == [10.0, 20.0, 20.0, 40.0] and not points[1]["valid"]
    targets = list(dict.fromkeys(asked))
    assert targets[:4] == [10.0, 20.0, 40.0, 80.0]  # doubles until the first failure
    assert doc["capacity_rps"] in targets
    for p in points:
        assert all(key in p for key in POINT_KEYS), sorted(set(POINT_KEYS) - set(p))
    # Failures are confirmed: each failing rate above the capacity was measured twice.
    assert asked.count(80.0) == 2
    # Nothing above the answer met the goal, judged from the document's own fields.
    for p in points:
        passed = (
            p["valid"]
            and p["stopped_early"] is None
            and p["p99_ms"] <= GOAL_P99_MS
            and not p["error_count"]
        )
        assert passed == (p["target"] <= doc["capacity_rps"] and p["valid"])
