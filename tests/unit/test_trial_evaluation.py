"""The evaluator's jobs, apart: the load plan and the slacks (pure), the capacity driver on a
scripted generator, and the evaluator asking the objective what to measure."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from analyzer.config.objective import objective_for
from analyzer.config.scenario import Scenario
from analyzer.evaluation import (
    CapacityDriver,
    Evaluation,
    Evaluator,
    Expected,
    LoadPlan,
    capacity_numbers,
    slacks,
)
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import CapacitySpec, Goals, LoadMode, LoadSpec


def scenario(**data: Any) -> Scenario:
    return Scenario.model_validate(data)


def level(spec: LoadSpec, p99_ms: float, throughput: float | None = None) -> Measurement:
    tp = spec.target if throughput is None else throughput
    return Measurement(
        spec.mode, spec.target, tp, 1.0, 1.0, 1.0, p99_ms, 400, 0, True, True, 0.0, None,
        offered_rps=tp,
    )  # fmt: skip


class Scripted:
    """A load generator whose p99 is a function of the level; it records every spec."""

    def __init__(self, p99: Callable[[LoadSpec], float], capacity_rps: float = 80.0) -> None:
        self.p99 = p99
        self.capacity_rps = capacity_rps
        self.measured: list[LoadSpec] = []
        self.searched: list[CapacitySpec] = []

    def measure(self, spec: LoadSpec) -> Measurement:
        self.measured.append(spec)
        return level(spec, self.p99(spec), throughput=spec.target * 10)

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        self.searched.append(spec)
        best = level(LoadSpec(LoadMode.REQUEST_RATE, self.capacity_rps), 20.0)
        return CapacityResult(spec.goals, self.capacity_rps, (best,), best, True)


# -- the load plan ------------------------------------------------------------------------------


def test_search_and_validation_steps() -> None:
    plan = LoadPlan(scenario(budget={"window_s": 3.0, "min_requests": 100}, run={"seed": 7}))
    search, validation = plan.step(), plan.step(2.0)
    assert search.mode is LoadMode.REQUEST_RATE and search.seed == 7
    assert (search.window_s, search.window_requests, search.max_windows) == (3.0, 100, 2)
    assert (validation.window_s, validation.window_requests, validation.max_windows) == (
        6.0,
        200,
        3,
    )
    closed = LoadPlan(scenario(traffic={"mode": "concurrency"}))
    assert closed.step().mode is LoadMode.CONCURRENCY and closed.unit == "users"


def test_warm_up_is_one_short_window_at_the_start_rate() -> None:
    plan = LoadPlan(
        scenario(traffic={"min_rate_rps": 5.0, "start_rps": 20.0}, budget={"warmup_s": 1.5})
    )
    spec = plan.warm_up()
    assert spec is not None
    assert (spec.target, spec.window_s, spec.warmup_s, spec.max_windows) == (20.0, 1.5, 0.0, 1)
    assert spec.window_requests is None and spec.fail_fast is None
    assert LoadPlan(scenario(budget={"warmup_s": 0})).warm_up() is None
    closed = LoadPlan(scenario(traffic={"mode": "concurrency", "concurrency": 4}))
    assert closed.warm_up() is not None and closed.warm_up().target == 4.0  # type: ignore[union-attr]


def test_reference_target() -> None:
    plan = LoadPlan(scenario(traffic={"min_rate_rps": 3.0}))
    assert plan.reference_target(60.0) == 60.0
    assert plan.reference_target(None) == 3.0
    closed = LoadPlan(scenario(traffic={"mode": "concurrency", "concurrency": 8}))
    assert closed.reference_target(60.0) == 8.0


def test_capacity_spec_start_and_growth() -> None:
    plan = LoadPlan(scenario(traffic={"min_rate_rps": 2.0, "max_rate_rps": 500.0}))
    first = plan.capacity_spec()
    assert (first.start_rps, first.growth, first.max_rps, first.min_rps) == (20.0, 2.0, 500.0, 2.0)
    assert first.confirm_failures and first.goals == Goals(100.0, 0.01)
    assert plan.capacity_spec(hint_rps=300.0).start_rps == 150.0
    assert plan.capacity_spec(hint_rps=10.0).start_rps == 20.0  # never below the start
    near = plan.capacity_spec(2.0, near_rps=200.0, hint_rps=300.0)
    assert (near.start_rps, near.growth, near.step.window_s) == (170.0, 1.5, 8.0)
    assert near.fails_at_rps is None
    # A failed validation check bounds the re-measurement; a bound at or below its start does
    # not (the search then descends from its start as usual).
    assert plan.capacity_spec(near_rps=200.0, fails_at_rps=200.0).fails_at_rps == 200.0
    assert plan.capacity_spec(near_rps=200.0, fails_at_rps=160.0).fails_at_rps is None
    assert plan.capacity_spec(fails_at_rps=200.0).fails_at_rps is None  # only with near_rps
    closed = LoadPlan(scenario(traffic={"mode": "concurrency", "max_concurrency": 64}))
    spec = closed.capacity_spec(hint_rps=300.0)
    assert (spec.start_rps, spec.max_rps, spec.min_rps) == (1, 64, 1)
    assert spec.step.mode is LoadMode.CONCURRENCY


# -- the slacks ----------------------------------------------------------------------------------


NUMBERS = {"throughput_rps": 100.0, "offered_rps": 100.0, "p99_ms": 50.0, "error_rate": 0.0}


def test_slacks_per_objective() -> None:
    s = scenario(goals={"p99_ms": 100.0, "max_error_rate": 0.01, "min_throughput_rps": 50.0})
    tp = slacks(NUMBERS, s.goals, s.traffic, objective_for("throughput"))
    assert tp == {"p99_slack": -0.5, "err_slack": -0.01, "throughput_slack": -1.0}
    lat = slacks(dict(NUMBERS, throughput_rps=90.0), s.goals, s.traffic, objective_for("latency"))
    assert lat["throughput_slack"] == pytest.approx((95.0 - 90.0) / 95.0, abs=1e-6)
    missed = dict(NUMBERS, throughput_rps=0.0, p99_ms=math.inf)
    none = slacks(missed, s.goals, s.traffic, objective_for("throughput"))
    assert none["throughput_slack"] == 1.0 and none["p99_slack"] == 99.0


def test_gpu_memory_slack_only_with_its_goal() -> None:
    s = scenario(goals={"max_gpu_memory_mb": 1000})
    obj = objective_for("throughput")
    assert (
        slacks(dict(NUMBERS, gpu_memory_peak_mb=500.0), s.goals, s.traffic, obj)["gpu_memory_slack"]
        == -0.5
    )
    assert slacks(NUMBERS, s.goals, s.traffic, obj)["gpu_memory_slack"] == 1.0
    plain = scenario()
    assert "gpu_memory_slack" not in slacks(NUMBERS, plain.goals, plain.traffic, obj)


# -- the capacity driver -------------------------------------------------------------------------


def test_open_loop_capacity_is_the_generators_search() -> None:
    load = Scripted(lambda spec: 20.0)
    spec = LoadPlan(scenario()).capacity_spec()
    result = CapacityDriver(load).run(spec)
    assert load.searched == [spec] and not load.measured
    assert result.capacity_rps == 80.0


def test_closed_loop_capacity_searches_user_counts_and_confirms_failures() -> None:
    # Up to 6 users meet the 100 ms goal; each user adds 10 req/s.
    load = Scripted(lambda spec: 20.0 if spec.target <= 6 else 500.0)
    plan = LoadPlan(scenario(traffic={"mode": "concurrency", "max_concurrency": 64}))
    phases: list[str] = []
    result = CapacityDriver(load, phases.append).run(plan.capacity_spec())
    users = [int(s.target) for s in load.measured]
    assert users[:4] == [1, 2, 4, 8] and users[4] == 8  # the first failure measured twice
    assert all(s.fail_fast == plan.goals for s in load.measured)
    assert result.best is not None and result.best.target == 6.0
    assert result.capacity_rps == 60.0 and result.bracketed
    assert "concurrency 8: confirming a failing level" in phases
    assert capacity_numbers(result, open_loop=False)["offered_rps"] == 60.0


def test_capacity_numbers_when_nothing_passed_are_the_gentlest_level() -> None:
    goals = Goals(10.0)
    points = tuple(level(LoadSpec(LoadMode.REQUEST_RATE, t), 50.0) for t in (40.0, 10.0, 20.0))
    numbers = capacity_numbers(CapacityResult(goals, 0.0, points, None, False), open_loop=True)
    assert (numbers["throughput_rps"], numbers["offered_rps"], numbers["p99_ms"]) == (
        0.0,
        10.0,
        50.0,
    )
    empty = capacity_numbers(CapacityResult(goals, 0.0, (), None, False), open_loop=True)
    assert empty["p99_ms"] == math.inf and empty["error_rate"] == 1.0


# -- the evaluator asks the objective ------------------------------------------------------------


def test_each_objective_measures_what_it_needs() -> None:
    load = Scripted(lambda spec: 30.0)
    tp = Evaluator(scenario(), load).evaluate()
    assert isinstance(tp, Evaluation) and tp.values == (80.0,)
    assert len(load.searched) == 1 and len(load.measured) == 1  # the warm-up only
    assert "points" in tp.measurement.to_dict() and tp.constraints["p99_slack"] == -0.8

    load = Scripted(lambda spec: 30.0)
    lat = Evaluator(scenario(objective="latency", traffic={"rate_rps": 6.0}), load).evaluate()
    assert not load.searched and [s.target for s in load.measured][1:] == [6.0]
    assert lat.values == (30.0,) and lat.numbers["offered_rps"] == 6.0

    load = Scripted(lambda spec: 30.0)
    ev = Evaluator(scenario(objective="pareto"), load)
    ev.reference_rps = 25.0
    front = ev.evaluate(2.0)
    assert len(load.searched) == 1 and load.measured[-1].target == 25.0
    assert load.measured[-1].window_s == 8.0
    assert front.values == (80.0, 30.0) and front.numbers["reference_p99_ms"] == 30.0
    assert set(front.measurement.to_dict()) == {"capacity", "reference"}


def test_a_capacity_search_starts_near_the_expected_capacity_with_small_steps() -> None:
    plan = LoadPlan(scenario(traffic={"min_rate_rps": 5.0, "max_rate_rps": 2000.0}))
    spec = plan.capacity_spec(expected=Expected(400.0), hint_rps=1000.0)
    assert spec.start_rps == pytest.approx(360.0) and spec.growth == pytest.approx(1.2)
    assert not spec.forecast_check and spec.expected_rps == 400.0
    # A validation re-measurement (near_rps) keeps its own start; the expectation is clipped.
    near = plan.capacity_spec(near_rps=100.0, expected=Expected(400.0, check=True))
    assert near.start_rps == pytest.approx(85.0) and not near.forecast_check
    assert plan.capacity_spec(expected=Expected(1.0)).start_rps == 5.0
    # A neighbour's capacity is a looser guess than a prediction: larger steps.
    assert plan.capacity_spec(expected=Expected(400.0, 1.5)).growth == pytest.approx(1.5)
    # Only a prediction says where a failure is expected; a neighbour's capacity does not.
    assert plan.capacity_spec(expected=Expected(400.0, 1.5, predicted=False)).expected_rps is None
    assert near.expected_rps is None
    # A forecast to check (the baseline): one step below it, one well above it.
    check = plan.capacity_spec(expected=Expected(400.0, check=True))
    assert check.forecast_check and check.start_rps == pytest.approx(360.0)
    assert check.start_rps * check.growth == pytest.approx(486.0)


def test_open_loop_capacity_steps_are_sequential_unless_turned_off() -> None:
    on = LoadPlan(scenario(goals={"p99_ms": 40.0}))
    step = on.capacity_spec().step
    assert step.sequential is not None and step.sequential.goal_ms == 40.0
    assert step.sequential.max_requests == on.scenario.budget.sequential_max_requests
    assert on.warm_up().sequential is None and on.fixed(10.0).sequential is None  # type: ignore[union-attr]
    off = LoadPlan(scenario(budget={"sequential": False}))
    assert off.capacity_spec().step.sequential is None
    closed = LoadPlan(scenario(traffic={"mode": "concurrency", "max_concurrency": 8}))
    assert closed.capacity_spec().step.sequential is None  # a user count is not tested


def test_check_is_one_sequential_step_whose_pass_stands_for_the_rate() -> None:
    s = scenario(goals={"p99_ms": 50.0})
    good = Evaluator(s, Scripted(lambda spec: 20.0))
    evaluation = good.check(300.0)
    spec = good.load.measured[-1]  # type: ignore[attr-defined]
    assert spec.target == 300.0 and spec.sequential is not None and spec.fail_fast is None
    assert evaluation.numbers["throughput_rps"] == 300.0
    assert evaluation.constraints["p99_slack"] < 0
    bad = Evaluator(s, Scripted(lambda spec: 80.0)).check(300.0)
    assert bad.numbers["throughput_rps"] == 0.0 and bad.constraints["p99_slack"] > 0


def test_a_fixed_level_the_generator_could_not_offer_is_measured_again() -> None:
    """As a capacity search does: an invalid level says nothing about the server yet."""

    class Stalled(Scripted):
        def measure(self, spec: LoadSpec) -> Measurement:
            m = super().measure(spec)
            fixed = [s for s in self.measured if s.target == 6.0]
            return replace(m, valid=len(fixed) != 1)  # the first fixed level stalled

    load = Stalled(lambda spec: 30.0)
    lat = Evaluator(scenario(objective="latency", traffic={"rate_rps": 6.0}), load).evaluate()
    assert [s.target for s in load.measured][1:] == [6.0, 6.0]
    assert lat.measurement.to_dict()["valid"]


def test_the_tightest_goal_bounds_the_send_lag() -> None:
    classes = [
        {"name": "urgent", "share": 0.3, "priority": 1, "p99_ms": 60.0},
        {"name": "bulk", "share": 0.7},
    ]
    assert scenario(goals={"p99_ms": 800.0}, traffic={"classes": classes}).tightest_p99_ms() == 60
    assert scenario(goals={"p99_ms": 800.0}).tightest_p99_ms() == 800


def test_several_shapes_search_each_and_the_worst_stands_for_the_config() -> None:
    class Shaped(Scripted):
        """Serves 200 req/s of Poisson arrivals, 60 of bursts; p99 80 ms under bursts."""

        def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
            self.capacity_rps = 200.0 if spec.step.arrival.to_text() == "poisson" else 60.0
            return super().find_capacity(spec)

    s = scenario(goals={"p99_ms": 50.0}, traffic={"arrival": ["poisson", "mmpp:20@0.005,0.2@0.1"]})
    load = Shaped(lambda spec: 20.0 if spec.arrival.to_text() == "poisson" else 80.0)
    evaluation = Evaluator(s, load).evaluate()
    assert [c.step.arrival.to_text() for c in load.searched] == ["poisson", "mmpp:20@0.005,0.2@0.1"]
    assert evaluation.numbers["throughput_rps"] == 60.0
    shapes = evaluation.measurement.to_dict()["shapes"]
    assert [(r["arrival"], r["capacity_rps"]) for r in shapes] == [
        ("poisson", 200.0),
        ("mmpp:20@0.005,0.2@0.1", 60.0),
    ]
    # A check passes only when every shape does; the first shape it fails ends it.
    check = Evaluator(s, load).check(100.0)
    assert check.numbers["throughput_rps"] == 0.0 and check.constraints["p99_slack"] > 0
    passing = Shaped(lambda spec: 20.0)
    assert Evaluator(s, passing).check(100.0).numbers["throughput_rps"] == 100.0
    assert [m.arrival.to_text() for m in passing.measured if m.sequential] == [
        "poisson",
        "mmpp:20@0.005,0.2@0.1",
    ]
