"""The evaluator: measures the loaded config the way its objective asks, into an
:class:`Evaluation`.

::

    warm-up (plan.warm_up) -> capacity search (objective.capacity: CapacityDriver.run),
                              one per arrival shape (plan.shapes), the worst standing for all
                           -> fixed level     (objective.fixed: plan.fixed at the reference)
    -> numbers (the capacity's operating point, else the fixed level) -> values (objective)
    -> slacks (analyzer.evaluation.slack)

    check(rate): warm-up -> one sequential step at the rate (plan.check) under each shape, until
    one fails -> the same record (validation: does the config serve the winner's capacity?)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from analyzer.config.objective import Objective, gentlest, objective_for
from analyzer.config.scenario import Scenario
from analyzer.evaluation.capacity import CapacityDriver
from analyzer.evaluation.plan import Expected, LoadPlan
from analyzer.evaluation.slack import slacks
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.generator import LoadGenerator
from analyzer.measure.goals import error_slack, meets_goals, p99_slack, token_slacks
from analyzer.measure.measurement import Measurement
from analyzer.rundir.measurements import (
    CapacityMeasurement,
    FixedMeasurement,
    ParetoMeasurement,
    ShapesMeasurement,
    TrialMeasurement,
)

#: The numbers of a capacity search that measured no level at all.
NOTHING_MEASURED: Mapping[str, float] = {
    "throughput_rps": 0.0,
    "offered_rps": 0.0,
    "p50_ms": 0.0,
    "p90_ms": 0.0,
    "p99_ms": math.inf,
    "error_rate": 1.0,
}


@dataclass(frozen=True)
class Evaluation:
    """What one measurement of a config produced.

    Attributes:
        numbers: The record's numbers: ``throughput_rps``, ``offered_rps``, ``p50_ms``,
            ``p90_ms``, ``p99_ms`` (infinite when nothing was measured), ``error_rate``,
            ``gpu_memory_peak_mb`` (NaN without GPU metrics) and, with a capacity search and a
            fixed level, ``reference_p99_ms``.
        measurement: The trial record's typed measurement (a capacity search, a fixed level,
            or both for pareto).
        values: The objective's values, in the study's direction order.
        constraints: The slacks (<= 0: satisfied).
    """

    numbers: Mapping[str, float]
    measurement: TrialMeasurement
    values: tuple[float, ...]
    constraints: Mapping[str, float]


def peak_gpu_memory_mb(m: Measurement) -> float:
    """The most memory any GPU held during ``m`` (NaN when no GPU figure was recorded)."""
    peaks = [
        g.memory_used_peak_mb
        for g in (m.server.gpus if m.server else ())
        if g.memory_used_peak_mb is not None
    ]
    return max(peaks) if peaks else math.nan


def level_numbers(m: Measurement, throughput: float, offered: float) -> dict[str, float]:
    """The numbers of one level, with the throughput and offered load it stands for."""
    return {
        "throughput_rps": throughput,
        "offered_rps": offered,
        "p50_ms": m.p50_ms,
        "p90_ms": m.p90_ms,
        "p99_ms": m.p99_ms,
        "error_rate": m.error_rate,
        "gpu_memory_peak_mb": peak_gpu_memory_mb(m),
    }


def capacity_numbers(result: CapacityResult, open_loop: bool) -> dict[str, float]:
    """The numbers of a capacity search: its best level at the capacity found; when nothing met
    the goals, the gentlest level tried at 0 req/s, so the slack says by how much."""
    best = result.best
    if best is not None:
        return level_numbers(
            best, result.capacity_rps, best.target if open_loop else best.offered_rps
        )
    point = gentlest(result.points)
    if point is None:
        return dict(NOTHING_MEASURED)
    return level_numbers(point, 0.0, point.target)


class Evaluator:
    """Measures the loaded config the way the objective asks for.

    Args:
        scenario: The validated scenario.
        load: The load generator.
        on_phase: Told what is being measured (the live view).

    Attributes:
        reference_rps: The fixed level's rate (``traffic.rate_rps``, or the objective's
            reference once the baseline is known).
        hint_rps: The best capacity so far (capacity searches start near half of it).
    """

    def __init__(
        self,
        scenario: Scenario,
        load: LoadGenerator,
        on_phase: Callable[[str], None] = lambda text: None,
    ) -> None:
        self.scenario = scenario
        self.objective: Objective = objective_for(scenario.objective)
        self.plan = LoadPlan(scenario)
        self.load = load
        self.on_phase = on_phase
        self.driver = CapacityDriver(load, on_phase)
        self.reference_rps: float | None = scenario.traffic.rate_rps
        self.hint_rps: float | None = None

    def evaluate(
        self,
        factor: float = 1.0,
        near_rps: float | None = None,
        expected: Expected | None = None,
        fails_at_rps: float | None = None,
    ) -> Evaluation:
        """Measure the loaded config.

        Args:
            factor: Window length factor (validation: ``budget.validate_window_factor``).
            near_rps: A known capacity (validation): the search starts just below it.
            expected: The config's expected capacity (predicted, or the nearest finished
                trial's): the search starts near it with small steps, or checks it.
            fails_at_rps: With ``near_rps``, a rate the config just failed at (validation).
        """
        self._warm_up()
        capacity: CapacityResult | None = None
        fixed: Measurement | None = None
        searches: list[tuple[str, CapacityResult]] = []
        if self.objective.capacity:
            shapes = self.plan.shapes
            for arrival in shapes:
                if len(shapes) > 1:
                    self.on_phase(f"arrivals {arrival.describe()}")
                spec = self.plan.capacity_spec(
                    factor,
                    near_rps=near_rps,
                    hint_rps=self.hint_rps,
                    expected=expected,
                    fails_at_rps=fails_at_rps,
                    arrival=arrival,
                )
                searches.append((arrival.to_text(), self.driver.run(spec)))
            # The config stands for its worst shape (the first of equals).
            capacity = min(searches, key=lambda s: s[1].capacity_rps)[1]
        if self.objective.fixed:
            target = self.plan.reference_target(self.reference_rps)
            self.on_phase(f"fixed load {target:g} {self.plan.unit}")
            fixed = self.load.measure(self.plan.fixed(target, factor))
            if not fixed.valid:
                # The generator, not the server, failed: that says nothing yet (as a capacity
                # search measures an invalid step again).
                self.on_phase("the load generator was saturated; measuring the level again")
                fixed = self.load.measure(self.plan.fixed(target, factor))
        measurement: TrialMeasurement
        if capacity is not None:
            numbers = capacity_numbers(capacity, self.plan.open_loop)
            measurement = CapacityMeasurement(capacity)
            if len(searches) > 1:
                measurement = ShapesMeasurement(tuple(searches))
            if fixed is not None:
                measurement = ParetoMeasurement(capacity, fixed)
                numbers["reference_p99_ms"] = fixed.p99_ms
        elif fixed is not None:
            numbers = level_numbers(fixed, fixed.throughput_rps, fixed.target)
            measurement = FixedMeasurement(fixed)
        else:  # pragma: no cover - every objective measures something
            raise AssertionError(f"objective {self.objective.name!r} measures nothing")
        constraints = self.constraints(numbers)
        level = capacity.best if capacity is not None else fixed
        if level is not None:
            # The operating point is judged as meets_goals judges it: a sequential level by its
            # verdict (BOUNDARY: on its point p99), traffic classes each against its own goal.
            constraints["p99_slack"] = round(p99_slack(level, self.plan.goals), 6)
            constraints["err_slack"] = round(error_slack(level, self.plan.goals), 6)
            constraints.update(self._token_slacks(level))
        return Evaluation(
            numbers=numbers,
            measurement=measurement,
            values=self.objective.values(numbers),
            constraints=constraints,
        )

    def check(self, rate_rps: float, factor: float = 1.0) -> Evaluation:
        """One sequential step at ``rate_rps`` on the loaded config (validation at the winner's
        capacity, open loop).

        A step that passes (PASS, or BOUNDARY with its point p99 within the goal) stands for a capacity of
        ``rate_rps``, as a capacity search's best level does; one that fails for none. The p99
        slack is the step's verdict over its point p99 (:func:`analyzer.measure.goals.p99_slack`),
        so the record meets the goals exactly when the test passed it.
        """
        self._warm_up()
        shapes = self.plan.shapes
        levels: list[Measurement] = []
        for arrival in shapes:
            under = f" under {arrival.describe()}" if len(shapes) > 1 else ""
            self.on_phase(f"sequential check at {rate_rps:.0f} req/s{under}")
            levels.append(self.load.measure(self.plan.check(rate_rps, factor, arrival)))
            if not meets_goals(levels[-1], self.plan.goals)[0]:
                break  # one shape it cannot serve at the rate is enough
        # Several shapes: the record is the level that missed, else the one nearest to missing.
        passed = meets_goals(levels[-1], self.plan.goals)[0]
        level = max(levels, key=lambda m: p99_slack(m, self.plan.goals)) if passed else levels[-1]
        numbers = level_numbers(level, rate_rps if passed else 0.0, level.target)
        constraints = self.constraints(numbers)
        constraints["p99_slack"] = round(p99_slack(level, self.plan.goals), 6)
        constraints["err_slack"] = round(error_slack(level, self.plan.goals), 6)
        constraints.update(self._token_slacks(level))
        return Evaluation(
            numbers=numbers,
            measurement=FixedMeasurement(level),
            values=self.objective.values(numbers),
            constraints=constraints,
        )

    def _token_slacks(self, level: Measurement) -> dict[str, float]:
        """A generative level's ``ttft_slack`` and ``itl_slack`` against the token goals
        (empty without them): the trial meets its goals only with both."""
        return {k: round(v, 6) for k, v in token_slacks(level, self.plan.goals).items()}

    def constraints(self, numbers: Mapping[str, float]) -> dict[str, float]:
        """Continuous slacks (<= 0: satisfied), the same keys for every trial."""
        s = self.scenario
        return slacks(numbers, s.goals, s.traffic, self.objective)

    def _warm_up(self) -> None:
        spec = self.plan.warm_up()
        if spec is None:
            return
        self.on_phase("warm-up after the config load")
        self.load.measure(spec)
