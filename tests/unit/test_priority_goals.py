"""Goals per traffic class: ``ClassStats`` records, ``meets_goals`` and ``p99_slack`` with classes."""

from __future__ import annotations

import json

import pytest

from analyzer.errors import InputError
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.goals import (
    FAIL_SLACK_FLOOR,
    class_slacks,
    classes_text,
    error_slack,
    meets_goals,
    p99_slack,
)
from analyzer.measure.measurement import ClassStats, Measurement, goals_dict
from analyzer.measure.specs import Goals, LoadMode
from analyzer.measure.stepping import SequentialRule, StepRecord, StepVerdict

#: p99 <= 50 ms for the urgent class, <= 500 ms (the run's goal) for bulk.
GOALS = Goals(p99_ms=500.0, max_error_rate=0.01, classes=(("urgent", 50.0),))


def _classes(urgent_p99: float = 40.0, bulk_p99: float = 400.0, bulk_errors: int = 0) -> tuple:
    return (
        ClassStats("urgent", priority=1, share=0.2, request_count=200, p50_ms=10.0,
                   p90_ms=20.0, p99_ms=urgent_p99),
        ClassStats("bulk", priority=2, share=0.8, request_count=800, error_count=bulk_errors,
                   p50_ms=100.0, p90_ms=200.0, p99_ms=bulk_p99),
    )  # fmt: skip


def _level(classes: tuple = (), p99_ms: float = 390.0, **over: object) -> Measurement:
    errors = sum(c.error_count for c in classes)
    base: dict[str, object] = dict(
        mode=LoadMode.REQUEST_RATE,
        target=100.0,
        throughput_rps=99.0,
        p50_ms=90.0,
        p90_ms=180.0,
        p95_ms=250.0,
        p99_ms=p99_ms,
        request_count=1000,
        error_count=errors,
        stable=True,
        valid=True,
        send_lag_p99_ms=0.5,
        server=None,
        classes=classes,
    )
    base.update(over)
    return Measurement(**base)  # type: ignore[arg-type]


def _step(verdict: StepVerdict, goal_ms: float) -> StepRecord:
    rule = SequentialRule(goal_ms)
    rule.add([1.0] * 1000)
    record = rule.decide() if rule.due else rule.stop(StepVerdict.BOUNDARY, "planted")
    return StepRecord.from_dict({**record.to_dict(), "verdict": verdict.value})


def test_every_class_within_its_own_goal_meets_the_goals() -> None:
    m = _level(_classes())
    ok, why = meets_goals(m, GOALS)
    assert ok, why
    assert (
        why
        == "every class meets its goal: urgent p99 40.00 ms <= 50 ms, bulk p99 400.00 ms <= 500 ms"
    )
    assert p99_slack(m, GOALS) == pytest.approx(max((40 - 50) / 50, (400 - 500) / 500))


def test_one_class_over_its_goal_misses_though_the_overall_p99_is_within() -> None:
    m = _level(_classes(urgent_p99=62.0), p99_ms=390.0)
    assert meets_goals(m, Goals(p99_ms=500.0))[0]  # no class goals: the bulk's goal for all
    ok, why = meets_goals(m, GOALS)
    assert not ok
    assert why == "class urgent: p99 62.00 ms > goal 50 ms"
    assert p99_slack(m, GOALS) == pytest.approx((62 - 50) / 50)
    assert class_slacks(m, GOALS)["urgent"]["p99_slack"] == pytest.approx(0.24)


def test_a_class_the_server_rejects_misses_the_error_budget_whatever_its_share() -> None:
    # 20 of 1000 requests failed: 2 % overall, but 2.5 % of the bulk class's own requests.
    m = _level(_classes(bulk_errors=20))
    assert not meets_goals(m, Goals(p99_ms=500.0, max_error_rate=0.021, classes=GOALS.classes))[0]
    ok, why = meets_goals(m, GOALS)
    assert not ok
    assert why == "class bulk: error rate 2.50% > goal 1.00% (20 of 800 failed)"
    assert error_slack(m, GOALS) == pytest.approx(0.025 - 0.01)
    assert p99_slack(m, GOALS) < 0  # the latency goals are met: only the errors miss


def test_a_class_without_requests_is_not_judged() -> None:
    quiet = (_classes()[0], ClassStats("bulk", priority=2, share=0.8))
    m = _level(quiet)
    assert set(class_slacks(m, GOALS)) == {"urgent"}
    assert meets_goals(m, GOALS)[0]


def test_without_classes_the_level_is_judged_as_before() -> None:
    m = _level(p99_ms=520.0)
    assert class_slacks(m, GOALS) == {}
    assert meets_goals(m, GOALS) == (False, "p99 520.00 ms > goal 500 ms")
    assert p99_slack(m, GOALS) == pytest.approx(20 / 500)
    assert error_slack(m, GOALS) == pytest.approx(-0.01)


def test_the_sequential_test_stays_on_the_overall_p99_and_pass_is_judged_per_class() -> None:
    # PASS on the overall p99 does not excuse a class over its own goal.
    passed = _level(_classes(urgent_p99=62.0), step=_step(StepVerdict.PASS, 500.0))
    ok, why = meets_goals(passed, GOALS)
    assert not ok
    assert why == (
        "class urgent: p99 62.00 ms > goal 50 ms (sequential test on the overall p99: pass)"
    )
    assert p99_slack(passed, GOALS) == pytest.approx(0.24)
    # PASS with every class within: met, and the slack is the worst class's (not clamped).
    fine = _level(_classes(), step=_step(StepVerdict.PASS, 500.0))
    ok, why = meets_goals(fine, GOALS)
    assert ok and why.endswith("(sequential test on the overall p99: pass)")
    assert p99_slack(fine, GOALS) == pytest.approx(-0.2)
    # BOUNDARY: met at the boundary when every class is within.
    boundary = _level(_classes(), step=_step(StepVerdict.BOUNDARY, 500.0))
    ok, why = meets_goals(boundary, GOALS)
    assert ok and why.startswith("every class at the boundary of its goal")
    # FAIL on the overall p99 misses, and its slack is positive though every class is within.
    failed = _level(_classes(), step=_step(StepVerdict.FAIL, 500.0))
    ok, why = meets_goals(failed, GOALS)
    assert not ok and "sequential test: fail" in why
    assert p99_slack(failed, GOALS) == FAIL_SLACK_FLOOR


def test_unusable_levels_miss_before_any_class_is_judged() -> None:
    m = _level(_classes(), valid=False)
    assert meets_goals(m, GOALS) == (False, "invalid measurement (generator saturated)")


def test_class_records_round_trip_and_older_records_read_without_them() -> None:
    m = _level(_classes(bulk_errors=3))
    data = json.loads(json.dumps(m.to_dict()))
    assert data["classes"][1] == {
        "name": "bulk",
        "priority": 2,
        "share": 0.8,
        "timeout_us": 0,
        "request_count": 800,
        "error_count": 3,
        "p50_ms": 100.0,
        "p90_ms": 200.0,
        "p99_ms": 400.0,
        "error_rate": 3 / 800,
    }
    assert Measurement.from_dict(data) == m
    plain = _level()
    assert "classes" not in plain.to_dict()  # the record of a run without a mix is unchanged
    assert Measurement.from_dict(plain.to_dict()).classes == ()


def test_class_goals_round_trip_in_a_capacity_result() -> None:
    m = _level(_classes())
    cap = CapacityResult(GOALS, 100.0, (m,), m, True, "ok")
    back = CapacityResult.from_dict(json.loads(json.dumps(cap.to_dict())))
    assert back == cap and back.goals.class_p99_ms("urgent") == 50.0
    assert back.goals.class_p99_ms("bulk") == 500.0
    assert "classes" not in goals_dict(Goals(p99_ms=5.0))  # older records' goals unchanged
    with pytest.raises(InputError, match="class 'urgent' must be positive"):
        Goals(p99_ms=5.0, classes=(("urgent", 0.0),))
    with pytest.raises(InputError, match=r"class 'bulk' \(800 ms\) is above the run's p99 goal"):
        Goals(p99_ms=500.0, classes=(("bulk", 800.0),))


def test_the_console_line_gives_each_class_against_its_own_goal() -> None:
    m = _level(_classes(urgent_p99=62.0, bulk_errors=20))
    assert classes_text(m, GOALS) == (
        "urgent p99 62.0/50 ms, bulk p99 400.0/500 ms (20 errors, 2.5%)"
    )
    assert classes_text(_level(), GOALS) == ""
