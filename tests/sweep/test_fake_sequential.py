"""The fake load generator honours ``LoadSpec.sequential``, so planted sweeps exercise it.

The planted p99 of each step sets its share of requests over the goal; the real sequential test
decides each step. Far from the capacity a step is decided after a few hundred requests; the
search's answer stays where the fixed-window search puts it (within a bracket step), and a step
at the boundary runs to the cap and, passed at the boundary, is labelled in the result.
"""

from __future__ import annotations

from dataclasses import replace

from analyzer.measure.goals import meets_goals
from analyzer.measure.stepping import StepTest, StepVerdict
from tests.sweep.planted import (
    FakeLoadGenerator,
    FakeTarget,
    knobs_from_config,
    planted_capacity_spec,
    share_over,
)

GOAL_MS = 50.0


def test_sequential_fake_steps_carry_their_verdicts_and_find_the_same_capacity() -> None:
    fixed_spec = planted_capacity_spec(GOAL_MS)
    test = StepTest(goal_ms=1.0, max_requests=20_000)  # the goal is the search's
    spec = replace(fixed_spec, step=replace(fixed_spec.step, sequential=test))
    fixed = FakeLoadGenerator(FakeTarget(), noise=0.0).find_capacity(fixed_spec)
    result = FakeLoadGenerator(FakeTarget(), noise=0.0).find_capacity(spec)
    assert all(p.step is None for p in fixed.points)
    assert result.points and all(p.step is not None for p in result.points)
    for p in result.points:
        assert p.step is not None and p.step.goal_ms == GOAL_MS
        assert p.request_count == p.step.n
        assert meets_goals(p, spec.goals)[0] is (p.step.verdict is not StepVerdict.FAIL)
        share = share_over(p.p99_ms, GOAL_MS)
        if share <= 0.001 or share >= 0.1:  # far from the goal: decided within the first looks
            assert p.step.verdict is (StepVerdict.PASS if share < 0.01 else StepVerdict.FAIL)
            assert p.step.n <= 2_000
    # Same bracket as the fixed-window search, to the search's resolution.
    low, high = sorted((fixed.capacity_rps, result.capacity_rps))
    assert high <= low * (1 + 2 * spec.resolution)
    assert result.best is not None and result.best.step is not None


def test_a_step_at_the_boundary_runs_to_the_cap_and_is_labelled() -> None:
    gen = FakeLoadGenerator(FakeTarget(), noise=0.0)
    # The goal exactly at the planted p99 at 10 req/s: 1 % over, the test cannot decide.
    goal = gen.model.p99_ms(knobs_from_config(gen.target.current), 10.0)
    spec = planted_capacity_spec(goal)
    test = StepTest(goal_ms=goal, max_requests=3_000)
    spec = replace(spec, start_rps=10.0, max_rps=10.0, step=replace(spec.step, sequential=test))
    result = gen.find_capacity(spec)
    (point,) = result.points
    assert point.step is not None and point.step.verdict is StepVerdict.BOUNDARY  # seeded
    assert point.step.n >= 3_000 and point.step.lower_share <= 0.01 <= point.step.upper_share
    assert result.at_boundary and result.capacity_rps == 10.0 and result.best is point
