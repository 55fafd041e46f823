"""The sentences a measured level carries, from what the runner counted (pure)."""

from __future__ import annotations

from dataclasses import replace

from analyzer.load.level_messages import LevelFacts, level_messages
from analyzer.measure.arrivals import parse_arrival
from analyzer.measure.specs import LoadMode, LoadSpec

OPEN = LoadSpec(LoadMode.REQUEST_RATE, 100.0)
CLEAN = LevelFacts(
    problems=[],
    send_lag_p99_ms=0.4,
    stable=True,
    checked_windows=None,
    windows=3,
    stopped_early=None,
    step_reason=None,
    offered_rps=100.0,
    gap_cv=1.0,
    late_share=0.0,
    pool_size=512,
    backlog_max=0,
    errors=0,
)


def test_a_clean_poisson_level_says_nothing() -> None:
    assert level_messages(OPEN, CLEAN) == []


def test_a_saturated_open_loop_leads_with_invalid_and_its_send_lag() -> None:
    facts = replace(CLEAN, problems=["generator CPU 97% of a core > 90%"], send_lag_p99_ms=42.0)
    first, *_ = level_messages(OPEN, facts)
    assert first.startswith("INVALID: the load generator was saturated (generator CPU 97%")
    assert "send-lag p99 42.0 ms" in first
    assert facts.problems == ["generator CPU 97% of a core > 90%"]  # the facts stay as counted


def test_unstable_is_a_verdict_without_a_step_and_a_check_with_one() -> None:
    shaky = replace(CLEAN, stable=False, windows=10)
    assert level_messages(OPEN, shaky)[0].startswith("UNSTABLE: the last 3 of 10 windows")
    stepped = replace(shaky, step_reason="PASS at 300 requests", checked_windows=3, windows=1)
    step, check = level_messages(OPEN, stepped)
    assert step == "sequential step: PASS at 300 requests"
    assert check.startswith("unstable (a check, not the stopping rule): the step's 3 equal parts")
    assert "(decided within 1 window)" in check
    assert not any(
        "unstable" in m.lower()
        for m in level_messages(OPEN, replace(shaky, stopped_early="p99 over goal"))
    )


def test_closed_loop_shaped_streams_pool_waits_errors_and_statistics() -> None:
    closed = LoadSpec(LoadMode.CONCURRENCY, 8.0)
    (note,) = level_messages(closed, CLEAN)
    assert "coordinated omission" in note
    shaped = replace(OPEN, arrival=parse_arrival("gamma:cv=2"))
    facts = replace(
        CLEAN,
        gap_cv=1.93,
        late_share=0.012,
        backlog_max=7,
        errors=9,
        error_kinds={"HTTP 503: busy": 5, "timeout": 3, "reset": 1, "refused": 0},
        scraper_errors={"metrics": "connection refused"},
    )
    arrivals, pool, errors, stats = level_messages(shaped, facts)
    assert arrivals.startswith("arrivals ") and "gap CV 1.93, 1.2% sent over 1 ms late" in arrivals
    assert "up to 7 requests waited" in pool
    assert errors == "9 failed requests: HTTP 503: busy x5, timeout x3, reset x1"
    assert stats == "server statistics unavailable: metrics: connection refused"
