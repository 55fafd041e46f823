"""``--search predict|tpe|random|grid`` on planted devices behind the real seams (fast).

``predict`` runs on :class:`~tests.sweep.planted.SimulatedDevice`: the device's latency is the
simulator's on a planted profile, and the sweep's profile phase returns that profile, so the
prediction is right and the search should need its first trial only. A device slower than its
profile makes the prediction wrong, and the search goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from analyzer.config.scenario import Scenario, load_scenario
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.specs import CapacitySpec
from analyzer.predict import ProfileError
from analyzer.predict.profile import Profile
from analyzer.rundir import records
from analyzer.rundir.measurements import CapacityMeasurement, FixedMeasurement
from analyzer.rundir.predictions import Predictions
from analyzer.rundir.trial_record import TrialRecord
from analyzer.search.strategy import grid_configs
from analyzer.sweep.loop import run_sweep, space_for
from analyzer.target.protocol import Target
from tests.sweep.planted import (
    FakeLoadGenerator,
    FakeTarget,
    SimulatedDevice,
    planted_profile,
)

GOAL_MS = 20.0
PROFILE = planted_profile(16)
#: A device this much slower than its profile: every prediction misses its band. (1.6 was used
#: until a capacity measured at its search's first rate, 0.9x the prediction, counted as
#: inside the band: at 1.6 the first trial lands there, and only rounding had kept it out.)
WRONG = 2.5


def scenario(tmp_path: Path, **overrides: Any) -> Scenario:
    flags = {
        "goals.p99_ms": GOAL_MS,
        "space.max_batch_size": [1, 8],
        "space.instance_count": [1, 2],
        "space.max_queue_delay_us": [0, 4000],
        "space.delay_steps": 3,
        "traffic.min_rate_rps": 5.0,
        "traffic.max_rate_rps": 20000.0,
        "budget.capacity_resolution": 0.05,
        "budget.trials": 8,
        "run.output_dir": str(tmp_path),
        **overrides,
    }
    return load_scenario(None, flags, env={})


@dataclass
class Recording(FakeLoadGenerator):
    """Keeps every capacity search's spec (where each started)."""

    specs: list[CapacitySpec] = field(default_factory=list)

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        self.specs.append(spec)
        return super().find_capacity(spec)


def planted(profile: Profile = PROFILE) -> Any:
    def profiler(target: Target, scenario: Scenario) -> Profile:
        return profile

    return profiler


def sweep(tmp_path: Path, scale: float = 1.0, profiler: Any = None, **overrides: Any) -> Any:
    s = scenario(tmp_path, **overrides)
    target = FakeTarget(base_max_batch_size=16)
    device = SimulatedDevice(profile=PROFILE, scale=scale)
    load = Recording(target, device, noise=0.0)
    outcome = run_sweep(s, target=target, load=load, profiler=profiler or planted())
    return outcome, load, target


def trials(outcome: Any) -> list[TrialRecord]:
    paths = sorted((outcome.run_dir / "trials").glob("*/measurement.json"))
    return [records.load_trial(p) for p in paths]


@pytest.mark.usefixtures("spawns")
def test_predict_measures_the_predicted_best_first_and_stops_in_its_band(tmp_path: Path) -> None:
    outcome, load, _ = sweep(tmp_path)
    predictions = records.load_predictions(outcome.run_dir)
    space = space_for(scenario(tmp_path))
    # Every config of the space has a prediction, in the space's order.
    assert [c.config for c in predictions.configs] == grid_configs(space)
    best = predictions.ranked()[0]
    done = trials(outcome)
    assert done[0].config == best.config and done[0].source == "predict"
    assert done[0].prediction == best.prediction
    # The device is the simulator: the measured best lies in the band, the search stops.
    assert outcome.stop_reason == "prediction"
    assert len(done) == 1
    assert best.prediction.contains(done[0].throughput_rps)
    # Its capacity search started near the prediction (not at start_rps) with small steps.
    first = load.specs[1]  # [0] is the baseline's
    assert first.start_rps == pytest.approx(0.9 * best.prediction.capacity_rps, rel=1e-3)
    assert first.growth == pytest.approx(1.2)
    assert first.step.sequential is not None  # sequential steps by default
    summary = records.load_summary(outcome.run_dir)
    assert summary.search_strategy == "predict" and summary.search_note is None
    assert set(summary.phases) == {"baseline", "profile", "predict", "search", "validation"}
    assert all(v >= 0 for v in summary.phases.values())
    assert "report" in outcome.phases
    assert summary.best is not None and summary.best.config == best.config


@pytest.mark.usefixtures("spawns")
def test_the_baseline_is_profiled_first_and_its_forecast_checked_in_two_steps(
    tmp_path: Path,
) -> None:
    outcome, load, _ = sweep(tmp_path)
    baseline = records.load_trial(outcome.run_dir / "baseline" / "measurement.json")
    # The baseline (the model's own config, no dynamic batching) is no config of the space,
    # yet it is predicted: its record carries the forecast, and its search starts below it.
    assert not baseline.config.dynamic_batching
    assert baseline.prediction is not None and baseline.prediction.capacity_rps > 0
    predicted = {c.config for c in records.load_predictions(outcome.run_dir).configs}
    assert baseline.config not in predicted  # never ranked, never enqueued
    first = load.specs[0]
    forecast = baseline.prediction.capacity_rps
    assert first.forecast_check and first.start_rps == pytest.approx(0.9 * forecast, rel=1e-3)
    assert first.growth == pytest.approx(1.35)
    # The device is the simulator: the forecast is right within its band, so the check
    # confirms it in two rates (a pass below it, a fail above it), the bracket of the gain.
    assert baseline.prediction.contains(baseline.throughput_rps)
    result = baseline.measurement.capacity  # type: ignore[union-attr]
    rates = sorted({p.target for p in result.points})
    assert rates == pytest.approx([0.9 * forecast, 0.9 * 1.35 * forecast], rel=1e-3)
    assert result.bracketed and result.capacity_rps == pytest.approx(rates[0])


@pytest.mark.usefixtures("spawns")
def test_a_wrong_prediction_makes_predict_go_on_down_its_ranking(tmp_path: Path) -> None:
    outcome, _, _ = sweep(tmp_path, scale=WRONG, **{"budget.trials": 4})
    predictions = records.load_predictions(outcome.run_dir)
    done = trials(outcome)
    assert outcome.stop_reason == "trials" and len(done) == 4
    # Each trial is a predicted config, never measured twice. (Which is ranked first moves:
    # every measurement recalibrates the latency offset and re-predicts; the first trial is
    # the predicted best of the device that matches its profile, in the test above.)
    assert {t.config for t in done} <= {c.config for c in predictions.configs}
    assert all(t.source == "predict" and t.prediction is not None for t in done)
    assert len({t.config for t in done}) == 4
    # The device is 2.5x slower than its profile: recalibrated on every operating point, a
    # prediction can land in its band, but not the measured best in the predicted best's.
    missed = [not t.prediction.contains(t.throughput_rps) for t in done]  # type: ignore[union-attr]
    assert any(missed)


@pytest.mark.usefixtures("takes_seconds")
def test_predict_falls_back_to_tpe_when_no_profile_can_be_taken(tmp_path: Path) -> None:
    def failing(target: Target, scenario: Scenario) -> Profile:
        raise ProfileError("model 'planted' cannot be probed: planted failure")

    outcome, _, _ = sweep(tmp_path, profiler=failing, **{"budget.trials": 3})
    summary = records.load_summary(outcome.run_dir)
    assert summary.search_strategy == "tpe"
    assert summary.search_note is not None and "planted failure" in summary.search_note
    assert "tpe" in summary.search_note
    assert not (outcome.run_dir / "predictions.json").exists()
    assert all(t.prediction is None for t in trials(outcome))
    assert "profile" in summary.phases and "predict" not in summary.phases
    # tpe's seeds come first, as before.
    assert trials(outcome)[0].source == "seed"


@pytest.mark.usefixtures("takes_seconds")
def test_a_fixed_load_objective_falls_back_to_tpe_without_profiling(tmp_path: Path) -> None:
    called: list[int] = []

    def profiler(target: Target, scenario: Scenario) -> Profile:
        called.append(1)
        return PROFILE

    outcome, _, _ = sweep(
        tmp_path,
        profiler=profiler,
        **{"objective": "latency", "traffic.rate_rps": 200.0, "budget.trials": 2},
    )
    summary = records.load_summary(outcome.run_dir)
    assert summary.search_strategy == "tpe" and not called
    assert summary.search_note is not None and "latency" in summary.search_note


@pytest.mark.usefixtures("takes_seconds")
def test_grid_measures_every_config_of_a_small_space(tmp_path: Path) -> None:
    flags = {
        "search.strategy": "grid",
        "space.max_batch_size": [1, 4],
        "space.delay_steps": 2,
        "space.preferred_batch_size": "none",
        "budget.trials": 50,
    }
    outcome, _, _ = sweep(tmp_path, **flags)
    expected = grid_configs(space_for(scenario(tmp_path, **flags)))
    assert len(expected) == 12  # 3 batch sizes x 2 delays x 2 instance counts
    done = trials(outcome)
    assert [t.config for t in done] == expected
    assert all(t.source == "grid" for t in done)
    assert outcome.stop_reason == "grid"
    summary = records.load_summary(outcome.run_dir)
    assert summary.search_strategy == "grid" and summary.search_note is None


@pytest.mark.usefixtures("takes_seconds")
def test_a_grid_larger_than_the_budget_says_so_and_measures_its_start(tmp_path: Path) -> None:
    flags = {"search.strategy": "grid", "budget.trials": 3}
    outcome, _, _ = sweep(tmp_path, **flags)
    expected = grid_configs(space_for(scenario(tmp_path, **flags)))
    assert [t.config for t in trials(outcome)] == expected[:3]
    note = records.load_summary(outcome.run_dir).search_note
    assert note is not None and f"{len(expected)} configs" in note and "3 trials" in note
    assert outcome.stop_reason == "trials"


@pytest.mark.usefixtures("takes_seconds")
def test_random_is_seeded_and_reproducible(tmp_path: Path) -> None:
    def configs(where: Path, seed: int) -> list[Any]:
        flags = {"search.strategy": "random", "budget.trials": 4, "run.seed": seed}
        outcome, _, _ = sweep(where, **flags)
        assert records.load_summary(outcome.run_dir).search_strategy == "random"
        done = trials(outcome)
        assert all(t.source == "search" for t in done)  # no seeds: the sampler alone
        return [t.config for t in done]

    first = configs(tmp_path / "a", 7)
    assert configs(tmp_path / "b", 7) == first
    assert configs(tmp_path / "c", 8) != first


@pytest.mark.usefixtures("spawns")
def test_validation_checks_winner_and_runner_up_at_the_winners_capacity(tmp_path: Path) -> None:
    # A resolution fine enough that the tie rule does not prefer the runner-up (a tie decided
    # by cost is one check of the cheaper config: tests/sweep/test_plateaus.py).
    overrides = {"budget.trials": 3, "budget.capacity_resolution": 0.02}
    outcome, _, _ = sweep(tmp_path, scale=WRONG, **overrides)
    validation = records.load_validation(outcome.run_dir / "validation.json")
    winner, runner_up = validation.candidates[:2]
    assert winner.search_throughput_rps >= runner_up.search_throughput_rps
    # Each was checked with one sequential step: the winner at its capacity less the
    # resolution (what the search claims for it), the runner-up at the winner's capacity.
    edge = (1 - 0.02) * winner.search_throughput_rps
    for c, at in ((winner, edge), (runner_up, winner.search_throughput_rps)):
        assert c.check_rps == pytest.approx(at)
        assert isinstance(c.check, FixedMeasurement) and c.check.level.step is not None
        assert c.check.level.target == pytest.approx(at)
    # Whole capacities re-measured only when the runner-up also served the winner's capacity
    # (or the winner did not hold its own): the repeats are then the re-measurements, else the
    # check.
    close = runner_up.check_met or not winner.check_met
    kind = CapacityMeasurement if close else FixedMeasurement
    assert all(isinstance(m, kind) for c in (winner, runner_up) for m in c.measurements)
    assert len(winner.measurements) == 1
    summary = records.load_summary(outcome.run_dir)
    assert [c.trial_number for c in summary.validation][:2] == [
        winner.trial_number,
        runner_up.trial_number,
    ]
    assert json.loads((outcome.run_dir / "summary.json").read_text())["phases"]["validation"] >= 0


@dataclass
class Interrupting(Recording):
    """Ctrl-C during the ``at``-th capacity search (1 = the baseline's)."""

    at: int = 0
    searches: int = 0

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        self.searches += 1
        if self.searches == self.at:
            raise KeyboardInterrupt
        return super().find_capacity(spec)


@pytest.mark.usefixtures("spawns")
def test_a_resumed_predict_run_keeps_its_predictions_and_profiles_once(tmp_path: Path) -> None:
    s = scenario(tmp_path, **{"budget.trials": 3, "budget.validate_top": 0})
    target = FakeTarget(base_max_batch_size=16)
    device = SimulatedDevice(profile=PROFILE, scale=WRONG)
    calls: list[int] = []

    def profiler(target: Target, scenario: Scenario) -> Profile:
        calls.append(1)
        return PROFILE

    first = run_sweep(
        s, target=target, load=Interrupting(target, device, noise=0.0, at=3), profiler=profiler
    )
    assert first.stop_reason == "interrupted" and calls == [1]
    predictions = (first.run_dir / "predictions.json").read_text()
    resumed = run_sweep(
        s,
        target=target,
        load=Recording(target, device, noise=0.0),
        run_dir=first.run_dir,
        resume=True,
        profiler=profiler,
    )
    assert calls == [1]  # the saved profile and predictions are reused
    done = [t for t in trials(resumed) if t.state == "complete"]
    # The first trial after the resume was chosen on, and carries, the saved prediction (each
    # later measurement refits the offset: the file then holds the refitted ones).
    saved = {c.config: c.prediction for c in Predictions.from_dict(json.loads(predictions)).configs}
    rerun = min((t for t in done if t.number > 0), key=lambda t: t.number)  # 0: before Ctrl-C
    assert rerun.prediction == saved[rerun.config]
    assert set(saved) == {
        c.config for c in records.load_predictions(first.run_dir / "predictions.json").configs
    }
    assert resumed.stop_reason == "trials" and len(done) == 3
    assert all(t.source == "predict" and t.prediction is not None for t in done)
    assert len({t.config for t in done}) == 3


@pytest.mark.usefixtures("takes_seconds")
def test_a_model_with_its_own_priorities_is_searched_with_tpe(tmp_path: Path) -> None:
    s = scenario(tmp_path, **{"budget.trials": 2})
    target = FakeTarget(base_max_batch_size=16)
    target.current.dynamic_batching.priority_levels = 2  # kept by every trial's config
    target.current.dynamic_batching.default_priority_level = 2
    load = Recording(target, SimulatedDevice(profile=PROFILE), noise=0.0)
    calls: list[int] = []

    def profiler(target: Target, scenario: Scenario) -> Profile:
        calls.append(1)
        return PROFILE

    outcome = run_sweep(s, target=target, load=load, profiler=profiler)
    summary = records.load_summary(outcome.run_dir)
    assert summary.search_strategy == "tpe" and calls == []  # never profiled
    assert summary.search_note is not None and "priority levels" in summary.search_note


@pytest.mark.usefixtures("takes_seconds")
def test_a_model_with_several_instance_groups_is_searched_with_tpe(tmp_path: Path) -> None:
    s = scenario(tmp_path, **{"budget.trials": 2})
    target = FakeTarget(base_max_batch_size=16)
    target.current.instance_group.add(count=1, kind=target.current.instance_group[0].kind)
    load = Recording(target, SimulatedDevice(profile=PROFILE), noise=0.0)
    outcome = run_sweep(s, target=target, load=load, profiler=planted())
    summary = records.load_summary(outcome.run_dir)
    assert summary.search_strategy == "tpe"
    assert summary.search_note is not None and "several instance groups" in summary.search_note
    # Every trial kept both groups, one count each (Triton's counting: the total is their sum).
    assert all(len(c.instance_group) == 2 for c in target.loads)
