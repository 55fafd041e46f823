"""The sequential step rule on planted latency series with known p99 (seeded; no clock, no sleeps).

Planted series: ``20 ms * exp(0.5 * z)`` with ``z`` a stationary Gaussian AR(1) of lag-one
correlation ``phi`` (``phi = 0``: independent). Its true q-quantile is ``20 * exp(0.5 * z_q)``,
so a goal placed at ``20 * exp(0.5 * z_g)`` has a known true share over the goal of ``1 - g``.
"""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import numpy as np
import pytest

from analyzer.errors import InputError
from analyzer.measure.stepping import (
    SequentialRule,
    StepRecord,
    StepTest,
    StepVerdict,
    betainc,
    clopper_pearson,
    decide_windows,
    integrated_time,
    latency_tau,
    window_dispersion,
)


def planted_goal(true_quantile: float) -> float:
    """The goal (ms) whose true share over it is ``1 - true_quantile``."""
    return 20.0 * math.exp(0.5 * NormalDist().inv_cdf(true_quantile))


def ar1_latencies(rng: np.random.Generator, shape: tuple[int, int], phi: float) -> np.ndarray:
    """Rows of stationary AR(1) latencies in ms (started from the stationary law: no transient)."""
    rows, n = shape
    z = np.empty(shape)
    z[:, 0] = rng.standard_normal(rows)
    noise = rng.standard_normal(shape) * math.sqrt(1.0 - phi * phi)
    for t in range(1, n):
        z[:, t] = phi * z[:, t - 1] + noise[:, t]
    return 20.0 * np.exp(0.5 * z)


def run_step(rule: SequentialRule, latencies: np.ndarray, window: int) -> StepRecord:
    """Feed windows until the verdict is final (the series is long enough to reach the cap)."""
    for start in range(0, latencies.size, window):
        record = rule.update(latencies[start : start + window])
        if record.verdict.final:
            return record
    raise AssertionError("series ended before the step was decided or capped")


def run_naive(test: StepTest, latencies: np.ndarray, window: int) -> StepRecord:
    """The same looks and levels on the same windows, counting requests as independent draws."""
    over: list[int] = []
    ns: list[int] = []
    for start in range(0, latencies.size, window):
        chunk = latencies[start : start + window]
        over.append(int((chunk > test.goal_ms).sum()))
        ns.append(chunk.size)
        record = decide_windows(test, over, ns, tau=1.0)
        if record.verdict.final:
            return record
    raise AssertionError("series ended before the step was decided or capped")


# --------------------------------------------------------------------------------------------------
# Verdicts on planted steps


def test_step_well_below_the_goal_passes_after_a_few_hundred_requests() -> None:
    goal = planted_goal(0.9999)  # true p99 is far below the goal: 0.01 % of requests are over
    for seed in range(5):
        lat = ar1_latencies(np.random.default_rng(seed), (1, 20_000), 0.0)[0]
        record = run_step(SequentialRule(goal), lat, window=100)
        assert record.verdict is StepVerdict.PASS
        assert record.n <= 1_000, record.reason
        assert record.upper_share < 0.01 <= record.target_share + 1e-12
        assert record.reason.startswith("pass:")


def test_step_well_above_the_goal_fails_at_the_first_look() -> None:
    goal = planted_goal(0.9)  # true p99 far above the goal: 10 % of requests are over
    for seed in range(5):
        lat = ar1_latencies(np.random.default_rng(seed), (1, 20_000), 0.0)[0]
        record = run_step(SequentialRule(goal), lat, window=100)
        assert record.verdict is StepVerdict.FAIL
        assert record.n <= 300, record.reason
        assert record.lower_share > 0.01
        assert record.over > 0.05 * record.n


def test_step_at_the_boundary_runs_to_the_cap_and_says_so() -> None:
    goal = planted_goal(0.99)  # true p99 == goal
    verdicts = []
    for seed in range(10):
        lat = ar1_latencies(np.random.default_rng(100 + seed), (1, 5_000), 0.0)[0]
        record = run_step(SequentialRule(goal, max_requests=5_000), lat, window=500)
        verdicts.append(record.verdict)
        if record.verdict is StepVerdict.BOUNDARY:
            assert record.n == 5_000
            assert record.lower_share <= 0.01 <= record.upper_share
            assert record.look == record.looks_total
            assert "boundary" in record.reason
    assert verdicts.count(StepVerdict.BOUNDARY) >= 9, verdicts


def test_autocorrelated_steps_far_from_the_boundary_still_decide_right() -> None:
    rng = np.random.default_rng(7)
    below = run_step(
        SequentialRule(planted_goal(0.9999)), ar1_latencies(rng, (1, 20_000), 0.9)[0], 500
    )
    above = run_step(
        SequentialRule(planted_goal(0.9)), ar1_latencies(rng, (1, 20_000), 0.9)[0], 500
    )
    assert below.verdict is StepVerdict.PASS
    assert above.verdict is StepVerdict.FAIL
    # Correlation costs samples: n_eff is far below n for both.
    assert below.tau > 5 and above.tau > 3


@pytest.mark.usefixtures("takes_seconds")
def test_false_verdict_rate_under_autocorrelation_stays_at_the_level_naive_rule_does_not() -> None:
    """At the planted boundary (true p99 == goal) any PASS or FAIL is a verdict the data cannot
    support at 95 %: each must happen in at most 5 % of steps (plus Monte-Carlo noise). The
    independent-binomial rule, with the same looks and levels on the same windows, does not."""
    reps, phi, cap, window = 200, 0.9, 5_000, 500
    data = ar1_latencies(np.random.default_rng(2024), (reps, cap), phi)
    goal = planted_goal(0.99)
    rule_verdicts, naive_verdicts = [], []
    for row in data:
        rule = SequentialRule(goal, max_requests=cap)
        rule_verdicts.append(run_step(rule, row, window).verdict)
        naive_verdicts.append(run_naive(rule.test, row, window).verdict)
    alpha = 0.05
    tolerance = 3.0 * math.sqrt(alpha * (1 - alpha) / reps)  # 3 binomial standard errors

    def rate(verdicts: list[StepVerdict], which: StepVerdict) -> float:
        return verdicts.count(which) / reps

    assert rate(rule_verdicts, StepVerdict.PASS) <= alpha + tolerance
    assert rate(rule_verdicts, StepVerdict.FAIL) <= alpha + tolerance
    assert rate(naive_verdicts, StepVerdict.PASS) > alpha + tolerance
    assert rate(naive_verdicts, StepVerdict.FAIL) > alpha + tolerance


# --------------------------------------------------------------------------------------------------
# The pieces


def test_clopper_pearson_matches_closed_forms_and_known_values() -> None:
    lower, upper = clopper_pearson(0, 100, 0.05)
    assert lower == 0.0
    assert upper == pytest.approx(1 - 0.05 ** (1 / 100), rel=1e-9)  # zero successes
    lower, upper = clopper_pearson(100, 100, 0.05)
    assert lower == pytest.approx(0.05 ** (1 / 100), rel=1e-9) and upper == 1.0
    lower, upper = clopper_pearson(50, 100, 0.025)  # the textbook two-sided 95 % interval
    assert (lower, upper) == (pytest.approx(0.398321, abs=1e-6), pytest.approx(0.601679, abs=1e-6))
    # Real-valued (effective) counts sit between their integer neighbours.
    assert (
        clopper_pearson(4, 100, 0.05)[1]
        < clopper_pearson(4.5, 100, 0.05)[1]
        < clopper_pearson(5, 100, 0.05)[1]
    )
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-12)  # 1 - sum of Bin(4, 0.4) <= 1


def test_integrated_time_of_ar1_is_near_its_closed_form() -> None:
    rng = np.random.default_rng(3)
    for phi in (0.0, 0.5, 0.8):
        z = ar1_latencies(rng, (1, 50_000), phi)[0]
        expected = (1 + phi) / (1 - phi)
        assert integrated_time(np.log(z)) == pytest.approx(expected, rel=0.2)
    assert integrated_time([1.0, 1.0, 1.0, 1.0]) == 1.0
    assert integrated_time([1.0, -1.0] * 50) == 1.0  # anti-correlated: never more than n samples


def test_latency_tau_sees_bursts_in_the_tail_that_the_bulk_does_not() -> None:
    rng = np.random.default_rng(5)
    lat = rng.uniform(10.0, 20.0, 10_000)  # independent bulk
    for start in range(0, 10_000, 1_000):
        lat[start : start + 10] = 100.0  # ten bursts of ten consecutive requests over the goal
    assert integrated_time(np.argsort(np.argsort(lat))) < 3
    assert latency_tau(lat, goal_ms=50.0) > 5


def test_window_dispersion_is_batch_means_variance_inflation() -> None:
    assert window_dispersion([1, 1, 1, 1], [100] * 4) == 1.0  # under-dispersed: floored at 1
    assert window_dispersion([0, 0, 0], [100] * 3) == 1.0  # nothing over: not estimable
    # One window holds all 40 requests over: chi-square / df is large.
    assert window_dispersion([0, 0, 40, 0], [1_000] * 4) > 20


def test_decide_windows_without_tau_uses_the_window_dispersion() -> None:
    test = StepTest(goal_ms=50.0, max_requests=4_000)
    clustered = decide_windows(test, [0, 0, 0, 36], [1_000] * 4)
    spread = decide_windows(test, [9, 9, 9, 9], [1_000] * 4)
    assert clustered.tau > 10 and spread.tau == 1.0
    assert spread.verdict is StepVerdict.UNDECIDED or spread.verdict is StepVerdict.BOUNDARY
    assert clustered.n_eff == pytest.approx(4_000 / clustered.tau)
    naive = decide_windows(test, [0, 0, 0, 36], [1_000] * 4, tau=1.0)
    assert naive.tau == 1.0 and naive.upper_share < clustered.upper_share


def test_looks_follow_the_grid_and_spend_the_crossed_points() -> None:
    test = StepTest(goal_ms=50.0, min_requests=200, max_requests=1_000, look_growth=1.5)
    assert test.looks == (200, 300, 450, 675, 1_000)
    alpha_per_look = 0.05 / 5
    before = decide_windows(test, [0], [150])
    assert before.verdict is StepVerdict.UNDECIDED and before.alpha_look == 0.0
    assert "next look at 200" in before.reason
    first = decide_windows(test, [0, 0], [150, 100])
    assert first.look == 1 and first.alpha_look == pytest.approx(alpha_per_look)
    between = decide_windows(test, [0, 0, 0], [150, 100, 40])  # 290: no grid point crossed
    assert between.alpha_look == 0.0 and between.verdict is StepVerdict.UNDECIDED
    jump = decide_windows(test, [0, 0], [250, 450])  # 250 -> 700 crosses 300, 450 and 675
    assert jump.look == 4 and jump.alpha_look == pytest.approx(3 * alpha_per_look)
    # With no request over, 700 independent requests put the 99th percentile below the goal.
    assert jump.verdict is StepVerdict.PASS


def test_rule_refuses_windows_after_a_final_verdict_and_bad_inputs() -> None:
    rule = SequentialRule(goal_ms=10.0)
    record = rule.update(np.full(300, 50.0))
    assert record.verdict is StepVerdict.FAIL and record.over == 300
    with pytest.raises(InputError, match="already decided"):
        rule.update([1.0])
    with pytest.raises(InputError):
        StepTest(goal_ms=0.0)
    with pytest.raises(InputError):
        StepTest(goal_ms=1.0, min_requests=500, max_requests=100)
    with pytest.raises(InputError):
        StepTest(goal_ms=1.0, confidence=1.0)
    with pytest.raises(InputError):
        decide_windows(StepTest(goal_ms=1.0), [5], [3])


def test_records_round_trip_as_data() -> None:
    test = StepTest(goal_ms=60.0, quantile=0.95, confidence=0.9)
    assert StepTest.from_dict(test.to_dict()) == test
    record = decide_windows(test, [3, 40], [200, 200])
    data = record.to_dict()
    assert data["verdict"] == record.verdict.value and data["n"] == 400 and data["over"] == 43
    assert StepRecord.from_dict(data) == record


# --------------------------------------------------------------------------------------------------
# Feeding ticks (what the load engine does): decide at grid points only, stop at other caps


def feed_ticks(rule: SequentialRule, latencies: np.ndarray, tick: int) -> tuple[StepRecord, int]:
    """Feed ``tick``-sized intervals as the engine does; the final record and the verdicts made."""
    decided = 0
    for start in range(0, latencies.size, tick):
        record = rule.feed(latencies[start : start + tick])
        if record is not None:
            decided += 1
            if record.verdict.final:
                return record, decided
    raise AssertionError("series ended before the step was decided or capped")


def test_fed_ticks_decide_planted_steps_early_and_the_boundary_at_the_cap() -> None:
    rng = np.random.default_rng(11)
    below, decided = feed_ticks(
        SequentialRule(planted_goal(0.9999)), ar1_latencies(rng, (1, 20_000), 0.0)[0], 37
    )
    assert below.verdict is StepVerdict.PASS and below.n <= 1_000
    assert decided == below.look  # one verdict per grid point reached, not one per tick
    above, _ = feed_ticks(
        SequentialRule(planted_goal(0.9)), ar1_latencies(rng, (1, 20_000), 0.0)[0], 37
    )
    assert above.verdict is StepVerdict.FAIL and above.n < 250
    boundary, _ = feed_ticks(
        SequentialRule(planted_goal(0.99), max_requests=5_000),
        ar1_latencies(rng, (1, 6_000), 0.0)[0],
        37,
    )
    assert boundary.verdict is StepVerdict.BOUNDARY and boundary.n >= 5_000
    assert boundary.lower_share <= 0.01 <= boundary.upper_share


def test_feeding_ticks_spends_every_grid_point_it_crosses() -> None:
    lat = ar1_latencies(np.random.default_rng(3), (1, 2_000), 0.0)[0]
    goal = planted_goal(0.99)  # at the boundary: this seeded step stays undecided to its cap
    per_look = 0.05 / 5
    fine = SequentialRule(goal, max_requests=1_000, min_requests=200)
    assert fine.test.looks == (200, 300, 450, 675, 1_000)
    seen = [r for start in range(0, 1_000, 5) if (r := fine.feed(lat[start : start + 5]))]
    # Ticks of 5 land on every grid point: one verdict at each, each at one look's level.
    assert [r.n for r in seen] == [200, 300, 450, 675, 1_000]
    assert seen[-1].verdict is StepVerdict.BOUNDARY
    assert all(r.alpha_look == pytest.approx(per_look) for r in seen)
    coarse = SequentialRule(goal, max_requests=1_000, min_requests=200)
    first = next(
        r for start in range(0, 1_000, 160) if (r := coarse.feed(lat[start : start + 160]))
    )
    # 160 -> 320 crosses 200 and 300: that verdict spends both points.
    assert first.n == 320 and first.look == 2
    assert first.alpha_look == pytest.approx(2 * per_look)


def test_stop_ends_an_undecided_step_as_boundary_or_fail_without_spending_alpha() -> None:
    rule = SequentialRule(planted_goal(0.99))
    rule.feed(ar1_latencies(np.random.default_rng(4), (1, 150), 0.0)[0])  # before the first look
    record = rule.stop(StepVerdict.BOUNDARY, "undecided at the step's cap of 2 windows")
    assert record.verdict is StepVerdict.BOUNDARY and record.n == 150
    assert record.alpha_look == 0.0 and record.reason.startswith("boundary: undecided at")
    assert record.goal_ms == rule.test.goal_ms
    assert rule.stop(StepVerdict.FAIL, "again") is record  # the step is over: its record stands
    guard = SequentialRule(10.0)
    failed = guard.stop(StepVerdict.FAIL, "stopped early: 900 requests in flight > bound 64")
    assert failed.verdict is StepVerdict.FAIL and failed.n == 0 and "in flight" in failed.reason
    with pytest.raises(InputError):
        SequentialRule(10.0).stop(StepVerdict.PASS, "a pass must be decided")
    decided = SequentialRule(10.0)
    decided.add(np.full(300, 50.0))  # a grid point reached but not looked at: looked at first
    assert decided.stop(StepVerdict.BOUNDARY, "cap").verdict is StepVerdict.FAIL


def test_slow_drift_of_the_bulk_does_not_inflate_tau_of_an_independent_tail() -> None:
    """A busy neighbour adds a slowly varying few ms to every request: the ranks of the latencies
    are then strongly correlated, but which requests land in the tail is not."""
    rng = np.random.default_rng(8)
    n = 10_000
    drift = 2.0 * np.sin(np.arange(n) / 400.0)  # seconds-long swings of +-2 ms
    lat = 10.0 + drift + rng.exponential(3.0, n)
    assert integrated_time(np.argsort(np.argsort(lat))) > 20
    assert latency_tau(lat, goal_ms=200.0) < 6


def queue_latencies(arrival: str, rate: float, service_ms: float, n: int) -> np.ndarray:
    """Latencies (ms) of a single server with a fixed service time under ``arrival`` (the
    Lindley recursion): the queue a bursty stream builds, request after request."""
    from analyzer.measure.arrivals import parse_arrival

    stream = parse_arrival(arrival).gaps(rate, 99)
    gaps = np.fromiter(itertools.islice(stream, n), float, n) * 1000.0
    out = np.empty(n)
    backlog = 0.0  # work ahead of the next arrival, ms
    for i in range(n):
        backlog = max(0.0, backlog - gaps[i]) if i else 0.0
        out[i] = backlog + service_ms
        backlog += service_ms
    return out


@pytest.mark.usefixtures("takes_seconds")
@pytest.mark.parametrize(
    ("arrival", "rate"),
    [("mmpp:2@1,0.5@2", 60.0), ("mmpp:4@0.5,0.25@2", 40.0), ("gamma:cv=3", 80.0)],
)
def test_false_verdict_rate_under_bursty_arrivals_stays_at_the_level(
    arrival: str, rate: float
) -> None:
    """Steps of a queue fed by bursts (7 ms a request; bursts at 2-4x the mean rate, some above
    what the server serves), each 5,000 requests from one long run, 5,000 apart, with the goal
    at the run's own p99: the planted boundary. Bursts put thousands of consecutive requests
    over the goal; the rule's tau sees them, and wrong verdicts stay at the 5 % level (measured:
    at most 8 FAIL and 1 PASS of 200 for these three shapes)."""
    reps, cap, gap, window = 200, 5_000, 5_000, 500
    lat = queue_latencies(arrival, rate, 7.0, reps * (cap + gap))
    goal = float(np.quantile(lat, 0.99))
    verdicts = []
    for r in range(reps):
        step = lat[r * (cap + gap) + gap : (r + 1) * (cap + gap)]
        verdicts.append(run_step(SequentialRule(goal, max_requests=cap), step, window).verdict)
    alpha = 0.05
    tolerance = 3.0 * math.sqrt(alpha * (1 - alpha) / reps)
    assert verdicts.count(StepVerdict.PASS) / reps <= alpha + tolerance, verdicts
    assert verdicts.count(StepVerdict.FAIL) / reps <= alpha + tolerance, verdicts
