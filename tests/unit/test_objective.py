"""The objectives: directions, values, the best trial, the repeat figure, the gain, the headline."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from analyzer.config.knobs import Knobs
from analyzer.config.objective import (
    OBJECTIVES,
    LatencyObjective,
    Objective,
    ParetoObjective,
    ThroughputObjective,
    gentlest,
    objective_for,
    worst_value,
)
from analyzer.errors import InputError
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.gain import GainSample
from analyzer.measure.measurement import GpuStats, Measurement, ServerView, WindowStats
from analyzer.measure.specs import Goals, LoadMode
from analyzer.rundir.measurements import (
    CapacityMeasurement,
    FixedMeasurement,
    ParetoMeasurement,
    TrialMeasurement,
)
from analyzer.rundir.validation import ValidationCandidate


@dataclass(frozen=True)
class R:
    number: int
    throughput_rps: float
    p99_ms: float
    meets_goals: bool = True
    state: str = "complete"
    measurement: TrialMeasurement | None = None
    config: str = ""


THROUGHPUT, LATENCY, PARETO = (objective_for(n) for n in ("throughput", "latency", "pareto"))
NUMBERS = {"throughput_rps": 120.0, "offered_rps": 125.0, "p99_ms": 40.0, "reference_p99_ms": 9.0}


def test_registry_names_every_objective_and_refuses_an_unknown_one() -> None:
    assert list(OBJECTIVES) == ["throughput", "latency", "pareto"]
    assert isinstance(THROUGHPUT, ThroughputObjective)
    assert isinstance(LATENCY, LatencyObjective)
    assert isinstance(PARETO, ParetoObjective)
    with pytest.raises(
        InputError, match=r"unknown objective 'speed'; use one of 'throughput', 'latency', 'pareto'"
    ):
        objective_for("speed")


@pytest.mark.parametrize(
    ("obj", "directions", "metric", "higher", "multi", "values"),
    [
        (THROUGHPUT, ("maximize",), "throughput_rps", True, False, (120.0,)),
        (LATENCY, ("minimize",), "p99_ms", False, False, (40.0,)),
        (PARETO, ("maximize", "minimize"), "throughput_rps", True, True, (120.0, 9.0)),
    ],
)
def test_directions_metric_and_values(
    obj: Objective,
    directions: tuple[str, ...],
    metric: str,
    higher: bool,
    multi: bool,
    values: tuple[float, ...],
) -> None:
    assert obj.directions == directions
    assert len(obj.metric_names) == len(directions)
    assert (obj.metric, obj.higher_is_better, obj.multi) == (metric, higher, multi)
    assert obj.values(NUMBERS) == values
    assert obj.value(NUMBERS) == NUMBERS[metric]
    assert obj.value(R(0, 120.0, 40.0)) == NUMBERS[metric]


def test_what_each_objective_measures() -> None:
    assert (THROUGHPUT.capacity, THROUGHPUT.fixed) == (True, False)
    assert (LATENCY.capacity, LATENCY.fixed) == (False, True)
    assert (PARETO.capacity, PARETO.fixed) == (True, True)
    assert PARETO.reference_rps(None, 200.0, 1.0) == 100.0
    assert PARETO.reference_rps(None, 0.0, 5.0) == 5.0
    assert PARETO.reference_rps(30.0, 200.0, 1.0) == 30.0
    assert THROUGHPUT.reference_rps(None, 200.0, 1.0) is None


def test_required_throughput() -> None:
    nothing = {"throughput_rps": 0.0, "offered_rps": 0.0}
    assert THROUGHPUT.required_throughput(nothing, 0.0, open_loop=True, min_rate_rps=5.0) == 5.0
    assert THROUGHPUT.required_throughput(NUMBERS, 3.0, open_loop=True, min_rate_rps=5.0) == 3.0
    assert LATENCY.required_throughput(NUMBERS, 0.0, open_loop=True, min_rate_rps=5.0) == (
        pytest.approx(0.95 * 125.0)
    )
    assert LATENCY.required_throughput(NUMBERS, 2.0, open_loop=False, min_rate_rps=5.0) == 2.0
    assert LATENCY.required_throughput(nothing, 0.0, open_loop=False, min_rate_rps=5.0) == 0.0


def test_best_skips_failed_and_infeasible_trials_and_keeps_the_first_of_equals() -> None:
    results = [
        R(0, 100.0, 30.0),
        R(1, 300.0, 10.0, meets_goals=False),
        R(2, 200.0, 50.0),
        R(3, 200.0, 20.0),
        R(4, 900.0, 1.0, state="failed"),
    ]
    assert THROUGHPUT.best(results) == results[2]
    assert PARETO.best(results) == results[2]
    assert LATENCY.best(results) == results[3]
    assert THROUGHPUT.best([]) is None
    assert THROUGHPUT.improved(R(5, 202.0, 1.0), results[2], 0.01) is False
    assert THROUGHPUT.improved(R(5, 203.0, 1.0), results[2], 0.01) is True
    assert LATENCY.improved(R(5, 1.0, 19.9), results[3], 0.01) is False
    assert LATENCY.improved(R(5, 1.0, 19.7), results[3], 0.01) is True


def test_validation_candidates_are_the_top_configs_once_each() -> None:
    feasible = [
        R(0, 100.0, 30.0, config="a"),
        R(1, 300.0, 40.0, config="b"),
        R(2, 250.0, 20.0, config="b"),
        R(3, 200.0, 10.0, config="c"),
    ]
    assert [r.number for r in THROUGHPUT.validation_candidates(feasible, 2)] == [1, 3]
    assert [r.number for r in LATENCY.validation_candidates(feasible, 2)] == [3, 2]
    assert THROUGHPUT.validation_candidates(feasible, 0) == []
    assert PARETO.validation_candidates(feasible, 3) == []


def test_repeat_figure_is_the_worst_repeat() -> None:
    assert THROUGHPUT.repeat_figure([120.0, 100.0, 130.0]) == 100.0
    assert PARETO.repeat_figure([120.0, 100.0]) == 100.0
    assert LATENCY.repeat_figure([12.0, 15.0, 11.0]) == 15.0
    assert worst_value("p99_ms", [12.0, 15.0]) == 15.0
    with pytest.raises(ValueError):
        THROUGHPUT.repeat_figure([])
    runs = [R(0, 120.0, 20.0), R(0, 150.0, 5.0, meets_goals=False), R(0, 110.0, 25.0)]
    assert THROUGHPUT.worst_repeat(runs) is runs[1]  # missed the goals: 0 req/s
    assert LATENCY.worst_repeat(runs) is runs[1]  # missed the goals: worst whatever its p99
    assert LATENCY.worst_repeat([runs[0], runs[2]]) is runs[2]
    assert THROUGHPUT.score(runs[1]) == 0.0 and LATENCY.score(runs[1]) == math.inf


def candidate(
    number: int,
    worst_rps: float,
    worst_p99_ms: float | None = None,
    measurements: tuple[TrialMeasurement | None, ...] = (),
) -> ValidationCandidate:
    return ValidationCandidate(
        number,
        Knobs(8),
        worst_rps,
        (worst_rps,),
        (worst_p99_ms or 1.0,),
        (True,),
        worst_rps,
        worst_p99_ms,
        True,
        measurements=measurements,
    )


def test_choose_the_best_worst_case() -> None:
    passing = [candidate(1, 100.0, 9.0), candidate(2, 150.0, 12.0)]
    assert THROUGHPUT.choose(passing, 0.1) == (passing[1], None)
    assert LATENCY.choose(passing, 0.1) == (passing[0], None)
    with pytest.raises(ValueError):
        THROUGHPUT.choose([], 0.1)


def test_a_throughput_tie_goes_to_the_lighter_config() -> None:
    def gpu(mem: float, util: float) -> TrialMeasurement:
        g = GpuStats("G", "H", util, util, (util,), mem, None, None, None)
        return FixedMeasurement(replace(level(1.0, 1.0), server=ServerView(gpus=(g,))))

    heavy = candidate(1, 100.0, measurements=(gpu(900.0, 80.0),))
    light = candidate(-1, 95.0, measurements=(gpu(300.0, 70.0),))
    chosen, why = THROUGHPUT.choose([heavy, light], 0.1)
    assert chosen is light
    assert why is not None and why.startswith("Chose the baseline (95.0 req/s, 300 MiB")
    assert THROUGHPUT.choose([heavy, light], 0.01) == (heavy, None)


def test_gain_and_its_label() -> None:
    assert THROUGHPUT.gain(100.0, 250.0) == 2.5
    assert LATENCY.gain(30.0, 10.0) == 3.0
    assert THROUGHPUT.gain_label == "best / baseline throughput"
    assert LATENCY.gain_label == "baseline p99 / best p99"
    assert THROUGHPUT.has_gain(R(-1, 100.0, 1.0), R(1, 200.0, 1.0))
    assert not THROUGHPUT.has_gain(R(-1, 100.0, 1.0, meets_goals=False), R(1, 200.0, 1.0))
    assert not THROUGHPUT.has_gain(R(-1, 0.0, 1.0), R(1, 200.0, 1.0))
    assert not LATENCY.has_gain(R(-1, 1.0, 10.0), R(1, 1.0, 0.0))


def level(target: float, p99_ms: float) -> Measurement:
    return Measurement(
        LoadMode.REQUEST_RATE, target, target, 1.0, 1.0, 1.0, p99_ms, 100, 0, True, True, 0.0, None
    )


def window(index: int, p99_ms: float) -> WindowStats:
    return WindowStats(index, 1.0, 5, 0, 5.0, 1.0, p99_ms, 1.0)


def test_gain_samples() -> None:
    capacity = CapacityResult(
        Goals(p99_ms=50.0, max_error_rate=0.01),
        100.0,
        (level(100.0, 20.0), level(140.0, 90.0), level(200.0, 95.0)),
        None,
        True,
    )
    r = R(1, 100.0, 20.0, measurement=CapacityMeasurement(capacity))
    assert THROUGHPUT.gain_sample(r) == GainSample(100.0, 100.0, 140.0)
    pareto = replace_measurement(r, ParetoMeasurement(capacity, level(50.0, 9.0)))
    assert PARETO.gain_sample(pareto) == GainSample(100.0, 100.0, 140.0)
    assert THROUGHPUT.gain_sample(R(1, 100.0, 20.0, meets_goals=False)) == GainSample(0.0, 0.0, 0.0)
    fixed = FixedMeasurement(replace(level(60.0, 20.0), windows=(window(0, 18.0), window(1, 23.0))))
    assert LATENCY.gain_sample(R(1, 60.0, 20.0, measurement=fixed)) == GainSample(20.0, 18.0, 23.0)
    assert LATENCY.gain_sample(R(1, 60.0, 20.0, meets_goals=False)) == GainSample(
        math.inf, math.inf, math.inf
    )

    # A re-measurement below a rate its validation check failed at is bracketed by that rate,
    # though it never measured it: not a lower bound (censored), and round-trips as such.
    bounded = replace(capacity, points=(level(100.0, 20.0),), fails_at_rps=118.0)
    assert bounded.lowest_fail_rps == 118.0
    assert CapacityResult.from_dict(bounded.to_dict()) == bounded
    r = R(1, 100.0, 20.0, measurement=CapacityMeasurement(bounded))
    assert THROUGHPUT.gain_sample(r) == GainSample(100.0, 100.0, 118.0, censored=False)
    unbounded = replace(bounded, fails_at_rps=None, bracketed=False)
    r = R(1, 100.0, 20.0, measurement=CapacityMeasurement(unbounded))
    assert THROUGHPUT.gain_sample(r) == GainSample(100.0, 100.0, 100.0, censored=True)


def replace_measurement(r: R, measurement: TrialMeasurement) -> R:
    return R(r.number, r.throughput_rps, r.p99_ms, r.meets_goals, r.state, measurement)


@dataclass(frozen=True)
class Entry:
    throughput_rps: float
    p99_ms: float
    validated_throughput_rps: float | None = None


def test_headlines() -> None:
    best, base = Entry(250.0, 40.0, 240.0), Entry(100.0, 60.0)
    assert THROUGHPUT.headline(best, base, "gain 2.50x", 100.0) == (
        "Best config serves 250.0 req/s within p99 ≤ 100.0 ms (p99 40.0 ms); the baseline "
        "serves 100.0 req/s — gain 2.50x. Re-measured in validation: 240.0 req/s (worst repeat)."
    )
    assert THROUGHPUT.headline(Entry(250.0, 40.0), base, None, 100) == (
        "Best config serves 250.0 req/s within p99 ≤ 100 ms (p99 40.0 ms); the baseline "
        "missed the goals, so there is no gain to state."
    )
    assert LATENCY.headline(best, base, "gain 1.50x", 100) == (
        "Best config: p99 40.0 ms (goal ≤ 100 ms); the baseline's is 60.0 ms — gain 1.50x."
    )
    assert LATENCY.measure_text({"p99_ms": 50}, {"rate_rps": 60.0}) == "fixed load 60.0"
    assert THROUGHPUT.measure_text({"p99_ms": 50}, {}) == "capacity at p99 <= 50 ms"


def test_gentlest_point_of_measurements_or_mappings() -> None:
    points = [{"target": 40.0}, {"target": 10.0}, {"target": 20.0}]
    assert gentlest(points) == {"target": 10.0}
    assert gentlest([]) is None
