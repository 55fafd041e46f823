"""Steps as long as their evidence needs (pure; planted series and a planted capacity).

A window holds the samples its percentile needs, bounded by ``window_s`` at low rates; a FAIL the
sequential test decided far beyond the goal stands without a repeat, a close one is repeated; the
forecast check's predicted failure is not repeated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest

from analyzer.config.scenario import Scenario
from analyzer.errors import InputError
from analyzer.evaluation.plan import LoadPlan
from analyzer.measure.capacity import find_capacity
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import CapacitySpec, Goals, LoadMode, LoadSpec
from analyzer.measure.stepping import (
    FAR_SHARE_FACTOR,
    SequentialRule,
    StepRecord,
    StepTest,
    StepVerdict,
    window_samples,
)


def lognormal(seed: int, n: int) -> np.ndarray:
    return 20.0 * np.exp(0.5 * np.random.default_rng(seed).standard_normal(n))


def goal_at(true_quantile: float) -> float:
    """The goal whose true share of requests over it is ``1 - true_quantile``."""
    return 20.0 * math.exp(0.5 * NormalDist().inv_cdf(true_quantile))


def run_step(goal: float, latencies: np.ndarray, window: int = 200, cap: int = 5_000) -> StepRecord:
    rule = SequentialRule(goal, max_requests=cap)
    record = None
    for start in range(0, cap, window):
        record = rule.update(latencies[start : start + window])
        if record.verdict.final:
            break
    assert record is not None
    return record


def test_a_window_holds_the_samples_its_percentile_needs() -> None:
    assert window_samples(0.99) == 1000
    assert window_samples(0.95) == 200
    assert window_samples(0.999) == 10_000
    with pytest.raises(InputError):
        window_samples(1.0)


def test_a_failure_far_beyond_the_goal_is_far_at_its_first_look() -> None:
    goal = goal_at(0.9)  # 10 % of the requests over a p99 goal
    for seed in range(5):
        record = run_step(goal, lognormal(seed, 5_000))
        assert record.verdict is StepVerdict.FAIL and record.n <= 400
        assert record.far_beyond, record.reason
        assert record.lower_share >= FAR_SHARE_FACTOR * record.target_share


def test_a_failure_close_to_the_goal_is_not_far_and_a_stop_never_is() -> None:
    goal = goal_at(0.985)  # 1.5 % over: a failure, but within twice the allowed share
    decided = [run_step(goal, lognormal(50 + seed, 20_000), cap=20_000) for seed in range(10)]
    fails = [r for r in decided if r.verdict is StepVerdict.FAIL]
    assert len(fails) >= 5
    assert not any(r.far_beyond for r in fails)
    rule = SequentialRule(goal_at(0.5))  # half the requests over, but stopped before a look
    rule.add(lognormal(1, 50))
    stopped = rule.stop(StepVerdict.FAIL, "a guard")
    assert stopped.verdict is StepVerdict.FAIL and not stopped.far_beyond
    passed = run_step(goal_at(0.9999), lognormal(2, 5_000))
    assert passed.verdict is StepVerdict.PASS and not passed.far_beyond


def test_far_failures_at_the_true_p99_stay_far_below_the_test_level() -> None:
    # The goal at the true p99: every FAIL is false; those that would skip the repeat are a
    # small part of the test's 5 %.
    goal = goal_at(0.99)
    records = [run_step(goal, lognormal(1000 + seed, 5_000), window=500) for seed in range(120)]
    false_fails = sum(r.verdict is StepVerdict.FAIL for r in records)
    far = sum(r.far_beyond for r in records)
    assert false_fails <= 0.05 * len(records) + 3 * math.sqrt(0.05 * 0.95 * len(records))
    assert far <= 1


# ---- the capacity search's repeats ---------------------------------------------------------------


def _record(verdict: StepVerdict, lower: float) -> StepRecord:
    return StepRecord(
        verdict=verdict,
        n=1000,
        over=50,
        tau=1.0,
        n_eff=1000.0,
        lower_share=lower,
        upper_share=0.1,
        target_share=0.01,
        alpha_look=0.005 if verdict is not StepVerdict.BOUNDARY else 0.0,
        look=3,
        looks_total=10,
        windows=1,
        reason=verdict.value,
        goal_ms=10.0,
    )


def _level(spec: LoadSpec, passed: bool, far: bool) -> Measurement:
    if passed:
        step, p99 = _record(StepVerdict.PASS, 0.0), 9.0
    elif far:
        step, p99 = _record(StepVerdict.FAIL, 0.05), 30.0
    else:
        step, p99 = _record(StepVerdict.FAIL, 0.012), 11.0
    return Measurement(
        spec.mode, spec.target, spec.target, 1.0, 1.0, 1.0, p99, 1000, 0, True, True, 0.0, None,
        step=step,
    )  # fmt: skip


def planted(
    capacity: float, far_above: float
) -> tuple[Callable[[LoadSpec], Measurement], list[float]]:
    """A server that meets the goal up to ``capacity`` and fails far beyond it above
    ``far_above`` (close to the goal between the two); the rates it was asked for."""
    asked: list[float] = []

    def measure(spec: LoadSpec) -> Measurement:
        asked.append(spec.target)
        return _level(spec, spec.target <= capacity, spec.target > far_above)

    return measure, asked


def _spec(**over: Any) -> CapacitySpec:
    step = LoadSpec(LoadMode.REQUEST_RATE, 1.0, sequential=StepTest(10.0))
    base: dict[str, Any] = dict(
        goals=Goals(10.0), start_rps=50.0, resolution=0.1, step=step, confirm_failures=True
    )
    return CapacitySpec(**{**base, **over})


def test_a_far_failure_counts_at_once_and_a_close_one_is_repeated() -> None:
    measure, asked = planted(capacity=130.0, far_above=160.0)
    result = find_capacity(_spec(), measure)
    assert 118.0 <= result.capacity_rps <= 130.0
    # 50, 100 pass; 200 fails far (once); bisection below it: 150 fails close (twice), ...
    assert asked.count(200.0) == 1
    close = [r for r in set(asked) if 130.0 < r <= 160.0]
    assert close and all(asked.count(r) == 2 for r in close)
    assert all(asked.count(r) == 1 for r in set(asked) if r <= 130.0)


def test_the_forecast_checks_predicted_failure_is_not_repeated_a_surprise_is() -> None:
    forecast = _spec(start_rps=90.0, growth=1.35, forecast_check=True)
    measure, asked = planted(capacity=100.0, far_above=1e9)  # every failure close
    result = find_capacity(forecast, measure)
    assert asked == [90.0, pytest.approx(121.5)]
    assert result.capacity_rps == 90.0 and result.lowest_fail_rps == pytest.approx(121.5)
    # The check's first step failing disagrees with the forecast: that failure is repeated.
    measure, asked = planted(capacity=60.0, far_above=1e9)
    find_capacity(forecast, measure)
    assert asked[:2] == [90.0, 90.0]
    # Without confirm_failures nothing is repeated, as before.
    measure, asked = planted(capacity=130.0, far_above=1e9)
    find_capacity(_spec(confirm_failures=False), measure)
    assert len(asked) == len(set(asked))


def test_a_failure_above_the_predicted_capacity_is_not_repeated_one_below_it_is() -> None:
    # Predicted 100 req/s: the search starts at 90 and steps by 1.2. The config serves 100.
    predicted = _spec(start_rps=90.0, growth=1.2, resolution=0.2, expected_rps=100.0)
    measure, asked = planted(capacity=100.0, far_above=1e9)  # every failure close to the goal
    result = find_capacity(predicted, measure)
    assert asked == [90.0, pytest.approx(108.0)]  # 108 fails where the prediction said: once
    assert result.capacity_rps == 90.0
    # The prediction was high (the config serves 60): 90 failing is a surprise, repeated.
    measure, asked = planted(capacity=60.0, far_above=1e9)
    find_capacity(predicted, measure)
    assert asked[:2] == [90.0, 90.0]


# ---- the windows of a sequential step ------------------------------------------------------------


def _plan(**budget: Any) -> LoadPlan:
    data = {"budget": {"window_s": 4.0, "min_requests": 200, **budget}}
    return LoadPlan(Scenario.model_validate(data))


def test_sequential_windows_hold_the_percentiles_samples_or_window_s_at_low_rates() -> None:
    plan = _plan()
    step = plan.capacity_step()
    assert step.sequential is not None and step.window_requests == 1000
    assert (step.min_window_s, step.max_window_s, step.min_window_requests) == (1.0, 4.0, 200)
    assert step.window_requests_at(500.0) == 1000  # 2 s, not 4
    assert step.window_requests_at(4000.0) == 4000  # at least a second
    assert step.window_requests_at(100.0) == 400  # window_s bounds it: as a time window
    assert step.window_requests_at(20.0) == 200  # and min_requests holds at the lowest rates
    # Validation's windows are factor times longer, the check's alike.
    longer = plan.check(300.0, factor=2.0)
    assert (longer.window_requests, longer.max_window_s, longer.min_window_requests) == (
        2000,
        8.0,
        400,
    )
    assert longer.target == 300.0 and longer.fail_fast is None
    # A plain (non-sequential) level keeps its windows.
    plain = plan.step()
    assert plain.max_window_s is None and plain.window_requests == 200
    assert plain.window_requests_at(500.0) == 2000
    # Never longer than before: the old window was max(window_s, min_requests) of requests.
    for rate in (5.0, 20.0, 60.0, 100.0, 250.0, 500.0, 2000.0):
        old = max(200, round(rate * 4.0))
        assert step.window_requests_at(rate) <= old


def test_a_sequential_window_closes_at_its_samples_or_at_window_s_once_it_holds_enough() -> None:
    step = _plan().capacity_step()
    ceiling = 30.0
    assert not step.window_closes(999, 3.0, ceiling)
    assert step.window_closes(1000, 2.0, ceiling)  # the samples: 2 s at 500 req/s
    assert not step.window_closes(5000, 0.5, ceiling)  # but at least a second
    assert step.window_closes(400, 4.0, ceiling)  # window_s at 100 req/s
    assert not step.window_closes(150, 7.5, ceiling)  # below min_requests: not yet
    assert step.window_closes(150, 30.0, ceiling)  # the engine's ceiling ends it anyway
    timed = LoadSpec(LoadMode.REQUEST_RATE, 1.0, window_s=3.0)
    assert not timed.window_closes(10**6, 2.9, ceiling) and timed.window_closes(0, 3.0, ceiling)


def test_a_window_cap_below_its_floor_is_refused() -> None:
    with pytest.raises(InputError, match="max_window_s"):
        replace(LoadSpec(LoadMode.REQUEST_RATE, 1.0, window_requests=10), max_window_s=0.5)
