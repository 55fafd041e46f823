"""The whole sweep against the planted model behind the real seams (Target, LoadGenerator).

Pure and fast: ``FakeTarget`` keeps the loaded ModelConfig in memory and ``FakeLoadGenerator``
answers from the planted formula, so these tests check the search, the records and the run
directory, not a server.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analyzer.config.knobs import Knobs
from analyzer.config.model_config import apply_knobs, knobs_of
from analyzer.config.scenario import Scenario, load_scenario
from analyzer.errors import InputError
from analyzer.measure.capacity import CapacityResult, CapacitySearch
from analyzer.measure.goals import meets_goals
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import CapacitySpec, LoadSpec
from analyzer.rundir.results import load_summary, load_trial_record, parse_config_text
from analyzer.sweep.loop import run_sweep, space_for
from tests.sweep.planted import (
    FakeLoadGenerator,
    FakeTarget,
    PlantedModel,
    brute_force,
    knobs_from_config,
    planted_capacity_spec,
)

#: A CPU-like device: expensive items, strong contention between instances. Its optimum is not
#: one of the seeds, so reaching it is the search's work.
CPU_LIKE = PlantedModel(
    base_ms=1.0, per_item_ms=2.0, superlinear_ms=0.03, host_item_ms=0.3, contention=0.35
)
GOAL_MS = 15.0


def scenario(tmp_path: Path, **overrides: Any) -> Scenario:
    flags = {
        "goals.p99_ms": GOAL_MS,
        "space.max_batch_size": [1, 64],
        "space.instance_count": [1, 4],
        "space.max_queue_delay_us": [0, 10000],
        "traffic.min_rate_rps": 5.0,
        "traffic.max_rate_rps": 20000.0,
        "budget.capacity_resolution": 0.05,
        "run.output_dir": str(tmp_path),
        # These tests are about TPE's search on the planted device (the fake target has no
        # server to profile); --search predict has its own tests (test_search_strategies.py).
        "search.strategy": "tpe",
        "run.report": False,  # rendered where a test reads it
        **overrides,
    }
    return load_scenario(None, flags, env={})


@pytest.mark.usefixtures("takes_seconds")
def test_planted_optimum_reached_within_default_budget(tmp_path: Path) -> None:
    s = scenario(tmp_path)
    assert s.budget.trials == Scenario().budget.trials  # the default budget, not a tuned one
    space = space_for(s)
    assert space.size() >= 200
    best_knobs, optimum, table = brute_force(CPU_LIKE, space, GOAL_MS)
    target = FakeTarget()
    seeds = space.seeds(knobs_of(target.model_config()), GOAL_MS)
    assert max(table[k] for k in seeds) < 0.95 * optimum  # the seeds alone do not get there

    summary = run_sweep(s, target=target, load=FakeLoadGenerator(target, CPU_LIKE, seed=0))

    assert summary.best is not None
    true_capacity = CPU_LIKE.capacity_rps(summary.best.config, GOAL_MS)
    assert true_capacity >= 0.95 * optimum, (
        summary.best.config,
        best_knobs,
        true_capacity,
        optimum,
    )
    assert summary.trials["complete"] <= s.budget.trials
    # The config written is the config chosen, and it is what the server was given.
    written = parse_config_text(summary.best_config_path.read_text())  # type: ignore[union-attr]
    assert knobs_from_config(written) == summary.best.config
    assert all(
        size <= cfg.max_batch_size
        for cfg in target.loads
        for size in cfg.dynamic_batching.preferred_batch_size
    )


@pytest.mark.usefixtures("takes_seconds")
def test_run_directory_matches_the_documented_layout(tmp_path: Path) -> None:
    # Repeats validation: every validation measurement is a repeat, so loads count as below
    # (the check validation's loads are in test_search_strategies.py).
    s = scenario(
        tmp_path, **{"budget.trials": 6, "budget.validation": "repeats", "run.report": True}
    )
    target = FakeTarget()
    generator = FakeLoadGenerator(target, CPU_LIKE)
    summary = run_sweep(s, target=target, load=generator)
    root = summary.run_dir
    # One discarded single-window warm-up per config load (baseline, trials, validation).
    warmups = [m for m in generator.measured if m.max_windows == 1 and m.fail_fast is None]
    repeats = sum(len(c["throughput_rps"]) for c in load_summary(root)["validation"])
    assert len(warmups) == len(target.loads) == 1 + 6 + repeats
    for name in (
        "run.json",
        "scenario.toml",
        "study.journal",
        "trials.csv",
        "summary.json",
        "report.html",
        "best/config.pbtxt",
        "baseline/config.pbtxt",
        "baseline/measurement.json",
        "validation.json",
    ):
        assert (root / name).exists(), name
    numbers = sorted(int(p.name) for p in (root / "trials").iterdir())
    assert numbers == list(range(6))
    for n in numbers:
        rec = load_trial_record(root / "trials" / f"{n:03d}" / "measurement.json")
        assert set(rec["constraints"]) == {"p99_slack", "err_slack", "throughput_slack"}
        assert parse_config_text((root / "trials" / f"{n:03d}" / "config.pbtxt").read_text())
    data = load_summary(root)
    for key in (
        "format_version",
        "model",
        "device",
        "goals",
        "objective",
        "baseline",
        "best",
        "gain",
        "trials",
        "environment",
    ):
        assert key in data, key
    for entry in (data["baseline"], data["best"]):
        assert set(entry["config"]) >= {
            "max_batch_size",
            "max_queue_delay_us",
            "preferred_batch_size",
            "instance_count",
        }
        assert {"throughput_rps", "p50_ms", "p99_ms", "meets_goals"} <= set(entry)
    assert data["best"]["config_path"] == "best/config.pbtxt"
    assert data["baseline"]["config"]["dynamic_batching"] is False
    assert data["gain"] == pytest.approx(
        data["best"]["throughput_rps"] / data["baseline"]["throughput_rps"], rel=1e-3
    )
    assert data["trials"]["total"] == 6
    assert data["environment"]["scenario_hash"] == s.hash()
    frame = pd.read_csv(root / "trials.csv")
    assert list(frame["number"]) == [-1, 0, 1, 2, 3, 4, 5]
    assert data["validation"] and all(
        len(c["throughput_rps"]) == s.budget.validate_repeats for c in data["validation"]
    )


@pytest.mark.usefixtures("takes_seconds")
def test_failed_load_is_a_failed_trial_and_the_sweep_goes_on(tmp_path: Path) -> None:
    s = scenario(tmp_path, **{"budget.trials": 5, "budget.validate_top": 0})
    # Load 1 is the baseline; loads 3 and 4 are trial 1 and its retry: that trial fails.
    target = FakeTarget(fail_loads={3, 4})
    summary = run_sweep(s, target=target, load=FakeLoadGenerator(target, CPU_LIKE))
    rec = load_trial_record(summary.run_dir / "trials" / "001" / "measurement.json")
    assert rec["state"] == "failed"
    assert "planted failure #4" in rec["failure"]
    assert summary.trials == {"complete": 4, "failed": 1, "interrupted": 0, "total": 5}
    frame = pd.read_csv(summary.run_dir / "trials.csv")
    assert frame.loc[frame.number == 1, "state"].item() == "failed"


@dataclass
class InterruptingGenerator(FakeLoadGenerator):
    """Raises KeyboardInterrupt (as Ctrl-C would) on the n-th capacity search."""

    interrupt_at: int = 0
    searches: int = 0

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        self.searches += 1
        if self.searches == self.interrupt_at:
            raise KeyboardInterrupt
        return super().find_capacity(spec)


@pytest.mark.usefixtures("takes_seconds")
def test_ctrl_c_keeps_finished_trials_and_resume_completes_the_budget(tmp_path: Path) -> None:
    s = scenario(tmp_path, **{"budget.trials": 6, "budget.validate_top": 0})
    target = FakeTarget()
    # Call 1 is the baseline, calls 2-4 are trials 0-2; call 5 (trial 3) is interrupted.
    first = run_sweep(
        s, target=target, load=InterruptingGenerator(target, CPU_LIKE, interrupt_at=5)
    )
    assert first.stop_reason == "interrupted"
    assert first.trials["complete"] == 3
    assert load_summary(first.run_dir)["stop_reason"] == "interrupted"
    before = {
        n: load_trial_record(first.run_dir / "trials" / f"{n:03d}" / "measurement.json")
        for n in range(3)
    }
    interrupted_config = (first.run_dir / "trials" / "003" / "config.pbtxt").read_text()

    resumed = run_sweep(
        s,
        target=target,
        load=FakeLoadGenerator(target, CPU_LIKE),
        run_dir=first.run_dir,
        resume=True,
    )
    assert resumed.stop_reason == "trials"
    assert resumed.trials["complete"] == 6
    for n, rec in before.items():  # finished trials untouched
        assert load_trial_record(first.run_dir / "trials" / f"{n:03d}" / "measurement.json") == rec
    # The interrupted config ran again under a new number.
    reruns = [
        p
        for p in (first.run_dir / "trials").iterdir()
        if p.name != "003" and (p / "config.pbtxt").read_text() == interrupted_config
    ]
    assert reruns
    assert load_summary(first.run_dir)["baseline"] is not None


@pytest.mark.usefixtures("takes_seconds")
def test_pareto_objective_writes_the_front(tmp_path: Path) -> None:
    s = scenario(tmp_path, objective="pareto", **{"budget.trials": 8})
    target = FakeTarget()
    summary = run_sweep(s, target=target, load=FakeLoadGenerator(target, CPU_LIKE))
    assert summary.pareto
    rates = [r.throughput_rps for r in summary.pareto]
    assert rates == sorted(rates, reverse=True)
    data = load_summary(summary.run_dir)
    for entry in data["pareto"]:
        path = summary.run_dir / entry["config_path"]
        assert knobs_from_config(parse_config_text(path.read_text())) == Knobs.from_dict(
            entry["config"]
        )


@pytest.mark.usefixtures("takes_seconds")
def test_latency_objective_minimises_p99_at_fixed_load(tmp_path: Path) -> None:
    s = scenario(tmp_path, objective="latency", **{"traffic.rate_rps": 60.0, "budget.trials": 8})
    target = FakeTarget()
    summary = run_sweep(s, target=target, load=FakeLoadGenerator(target, CPU_LIKE, noise=0.0))
    assert summary.best is not None
    results = [
        load_trial_record(p / "measurement.json") for p in (summary.run_dir / "trials").iterdir()
    ]
    feasible = [r["p99_ms"] for r in results if r["meets_goals"]]
    assert summary.best.p99_ms == pytest.approx(min(feasible))
    assert all(r["offered_rps"] == 60.0 for r in results)


def test_apply_knobs_keeps_everything_else() -> None:
    base = FakeTarget().model_config()
    base.parameters["profile"].string_value = "x"
    cfg = apply_knobs(base, Knobs(16, 250, (16, 8), 3))
    assert cfg.parameters["profile"].string_value == "x" and cfg.backend == base.backend
    assert knobs_from_config(cfg) == Knobs(16, 250, (16, 8), 3)
    assert knobs_of(apply_knobs(cfg, Knobs(4, dynamic_batching=False))) == Knobs(
        4, dynamic_batching=False
    )


@pytest.mark.usefixtures("takes_seconds")
def test_baseline_is_kept_when_no_searched_config_beats_it(tmp_path: Path) -> None:
    # Every searched config waits >= 8 ms for a batch: at a 15 ms goal that only hurts.
    s = scenario(
        tmp_path,
        **{
            "space.max_queue_delay_us": [8000, 10000],
            "space.delay_steps": 2,
            "space.instance_count": [1, 1],
            "space.max_batch_size": [4, 16],
            "budget.trials": 4,
            "budget.validate_top": 2,
        },
    )
    target = FakeTarget()
    summary = run_sweep(s, target=target, load=FakeLoadGenerator(target, CPU_LIKE, noise=0.0))
    assert summary.baseline is not None and summary.baseline.meets_goals
    searched = [load_trial_record(p) for p in summary.run_dir.glob("trials/*/measurement.json")]
    assert all(r["throughput_rps"] < summary.baseline.throughput_rps for r in searched)
    assert summary.best is not None and summary.best.number == -1
    assert summary.gain == 1.0
    written = parse_config_text(summary.best_config_path.read_text())  # type: ignore[union-attr]
    assert not written.HasField("dynamic_batching")
    validated = load_summary(summary.run_dir)["validation"]
    assert -1 in [c["trial_number"] for c in validated]


def test_no_validation_when_no_check_could_change_the_recommendation(tmp_path: Path) -> None:
    # The one searched config is the model's own batch size with dynamic batching on and no
    # delay: at one instance it serves what the baseline does, well within a 40 % bracket.
    s = scenario(
        tmp_path,
        **{
            "space.max_batch_size": [8, 8],
            "space.max_queue_delay_us": [0, 0],
            "space.instance_count": [1, 1],
            "space.preferred_batch_size": "none",
            "budget.trials": 1,
            "budget.capacity_resolution": 0.4,
        },
    )
    target = FakeTarget()
    generator = FakeLoadGenerator(target, CPU_LIKE, noise=0.0)
    outcome = run_sweep(s, target=target, load=generator)
    summary = load_summary(outcome.run_dir)
    assert summary["gain_significant"] is False
    # Not one check: a check can only lower the trial's figure, so the model's own config is
    # the recommendation whatever it reads, and the run says why it measured nothing more.
    assert summary["validation"] == []
    assert not (outcome.run_dir / "validation.json").exists()
    assert "validation not needed" in summary["search_note"]
    assert "not significantly better than the baseline" in summary["search_note"]
    assert summary["recommendation"]["config"] == "original"


@pytest.mark.usefixtures("takes_seconds")
def test_closed_loop_capacity_searches_whole_user_counts(tmp_path: Path) -> None:
    s = scenario(
        tmp_path,
        **{"traffic.mode": "concurrency", "traffic.max_concurrency": 64, "budget.trials": 3},
    )
    target = FakeTarget()
    generator = FakeLoadGenerator(target, CPU_LIKE, noise=0.0)
    summary = run_sweep(s, target=target, load=generator)
    levels = [m.target for m in generator.measured if m.max_windows != 1]  # warm-ups excluded
    assert levels and all(t == int(t) and 1 <= t <= 64 for t in levels)
    assert summary.best is not None and summary.best.throughput_rps > 0
    record = load_trial_record(summary.run_dir / "trials" / "000" / "measurement.json")
    assert record["measurement"]["points"]


def test_a_model_without_batch_dimension_is_refused_up_front(tmp_path: Path) -> None:
    target = FakeTarget(base_max_batch_size=0)
    with pytest.raises(InputError, match="max_batch_size 0"):
        run_sweep(scenario(tmp_path), target=target, load=FakeLoadGenerator(target, CPU_LIKE))
    assert target.loads == []  # nothing was pushed to the server
    assert not list(tmp_path.glob("*/run.json"))  # refused before the run started


@dataclass
class SaturatedAtMostInstances(FakeLoadGenerator):
    """Planted: configs on the most instances get an invalid (generator-saturated) measurement
    whose p99 looks excellent; the sweep must not believe it."""

    saturated_instances: int = 4

    def measure(self, spec: LoadSpec) -> Measurement:
        m = super().measure(spec)
        if knobs_from_config(self.target.current).instance_count == self.saturated_instances:
            return replace(m, valid=False, p99_ms=0.5, p50_ms=0.2, p90_ms=0.4, p95_ms=0.45)
        return m


@pytest.mark.usefixtures("takes_seconds")
def test_latency_objective_never_picks_an_invalid_measurement(tmp_path: Path) -> None:
    s = scenario(
        tmp_path,
        objective="latency",
        **{"traffic.rate_rps": 60.0, "budget.trials": 6, "run.report": True},
    )
    target = FakeTarget()
    summary = run_sweep(
        s, target=target, load=SaturatedAtMostInstances(target, CPU_LIKE, noise=0.0)
    )
    records = [load_trial_record(p) for p in summary.run_dir.glob("trials/*/measurement.json")]
    invalid = [r for r in records if r["config"]["instance_count"] == 4]
    assert invalid, "the seeds include the most instances: the planted case must be measured"
    assert not any(r["meets_goals"] for r in invalid)
    assert summary.best is not None and summary.best.config.instance_count != 4
    assert summary.best.p99_ms > 0.5
    # The record, the report and a re-read trial agree on the one rule.
    from analyzer.rundir.trial_record import TrialRecord

    assert not any(TrialRecord.from_dict(r).feasible for r in invalid)
    html = (summary.run_dir / "report.html").read_text()
    data = json.loads(re.search(r'id="perfsweep-data">(.*?)</script>', html, re.S).group(1))  # type: ignore[union-attr]
    assert all(not t["meets_goals"] for t in data["trials"] if t["config"]["instance_count"] == 4)


@dataclass
class OneSpike(FakeLoadGenerator):
    """The real engine's capacity loop (re-measure a failing step when asked to confirm it) on
    the planted formula, with one latency spike: the first measurement at ``spike_from_rps`` or
    above, once per capacity search, reads a p99 far beyond the goal."""

    spike_from_rps: float = 0.0
    searches: list[CapacitySpec] = field(default_factory=list)

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        self.searches.append(spec)
        knobs = knobs_from_config(self.target.current)
        search = CapacitySearch(spec)
        points: list[Measurement] = []
        spiked = False
        while (rate := search.next_rate()) is not None:
            m = self._measurement(rate, knobs, self.model.p99_ms(knobs, rate))
            if not spiked and rate >= self.spike_from_rps:
                spiked = True
                m = replace(m, p99_ms=10 * spec.goals.p99_ms)
            points.append(m)
            passed = meets_goals(m, spec.goals)[0]
            if not passed and spec.confirm_failures:
                m = self._measurement(rate, knobs, self.model.p99_ms(knobs, rate))
                points.append(m)
                passed = meets_goals(m, spec.goals)[0]
            search.record(rate, passed)
        capacity = search.capacity_rps
        best = next(
            (m for m in reversed(points) if m.target == capacity and meets_goals(m, spec.goals)[0]),
            None,
        )
        return CapacityResult(spec.goals, capacity, tuple(points), best, search.bracketed)


@pytest.mark.usefixtures("takes_seconds")
def test_one_noisy_failing_step_does_not_halve_the_capacity(tmp_path: Path) -> None:
    s = scenario(tmp_path, **{"budget.trials": 1, "budget.validate_top": 0})
    target = FakeTarget()
    base_knobs = knobs_of(target.model_config())
    true_capacity = CPU_LIKE.capacity_rps(
        base_knobs,
        GOAL_MS,
        replace(
            planted_capacity_spec(GOAL_MS),
            start_rps=s.traffic.start_rps or 50.0,
            min_rps=5.0,
            max_rps=20000.0,
            resolution=0.05,
        ),
    )
    # The spike hits the first step at or above half the capacity: unconfirmed, it caps the
    # search below the spiked rate, i.e. at about half of the truth or less.
    generator = OneSpike(target, CPU_LIKE, noise=0.0, spike_from_rps=0.5 * true_capacity)
    summary = run_sweep(s, target=target, load=generator)
    assert generator.searches and all(spec.confirm_failures for spec in generator.searches)
    assert summary.baseline is not None
    assert summary.baseline.throughput_rps >= 0.9 * true_capacity


@pytest.mark.usefixtures("takes_seconds")
def test_closed_loop_capacity_confirms_a_failing_step(tmp_path: Path) -> None:
    overrides = {
        "traffic.mode": "concurrency",
        "traffic.max_concurrency": 64,
        "budget.trials": 1,
        "budget.validate_top": 0,
    }
    target = FakeTarget()
    clean = run_sweep(
        scenario(tmp_path / "clean", **overrides),
        target=target,
        load=FakeLoadGenerator(target, CPU_LIKE, noise=0.0),
    )
    assert clean.baseline is not None and clean.baseline.throughput_rps > 0
    target = FakeTarget()
    noisy = run_sweep(
        scenario(tmp_path / "noisy", **overrides),
        target=target,
        load=SpikeOnce(target, CPU_LIKE, noise=0.0, spike_users=2),
    )
    assert noisy.baseline is not None
    assert noisy.baseline.throughput_rps == pytest.approx(clean.baseline.throughput_rps)


@dataclass
class SpikeOnce(FakeLoadGenerator):
    """The first measured level at ``spike_users`` reads a p99 far beyond the goal."""

    spike_users: int = 2
    spiked: bool = False

    def measure(self, spec: LoadSpec) -> Measurement:
        m = super().measure(spec)
        if spec.max_windows != 1 and spec.target == self.spike_users and not self.spiked:
            self.spiked = True
            return replace(m, p99_ms=10 * GOAL_MS)
        return m


@dataclass
class PlantedCapacities(FakeLoadGenerator):
    """Capacity per config = ``batched_rps`` with dynamic batching, else ``plain_rps``, times a
    seeded +-``jitter`` per search; each search brackets it within 5 % (pass, then fail)."""

    plain_rps: float = 100.0
    batched_rps: float = 100.0
    jitter: float = 0.04
    #: The most the generator offers: a config that serves more passes at every rate offered.
    ceiling_rps: float | None = None

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        knobs = knobs_from_config(self.target.current)
        truth = self.batched_rps if knobs.dynamic_batching else self.plain_rps
        capacity = round(truth * (1 + self._rng.uniform(-self.jitter, self.jitter)), 2)
        if self.ceiling_rps is not None and capacity > self.ceiling_rps:
            ok = self._measurement(self.ceiling_rps, knobs, 0.5 * spec.goals.p99_ms)
            return CapacityResult(spec.goals, self.ceiling_rps, (ok,), ok, False)
        ok = self._measurement(capacity, knobs, 0.5 * spec.goals.p99_ms)
        bad = replace(self._measurement(capacity * 1.05, knobs, 3 * spec.goals.p99_ms))
        return CapacityResult(spec.goals, capacity, (ok, bad), ok, True)


def _uncertainty_run(
    tmp_path: Path, batched_rps: float, ceiling_rps: float | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    s = scenario(
        tmp_path,
        # The gain's interval rests on repeats of both sides: the repeats validation.
        **{
            "budget.trials": 3,
            "budget.validate_top": 1,
            "budget.validate_repeats": 3,
            "budget.validation": "repeats",
            "run.report": True,
        },
    )
    target = FakeTarget()
    summary = run_sweep(
        s,
        target=target,
        load=PlantedCapacities(target, CPU_LIKE, batched_rps=batched_rps, ceiling_rps=ceiling_rps),
    )
    html = (summary.run_dir / "report.html").read_text()
    data = json.loads(re.search(r'id="perfsweep-data">(.*?)</script>', html, re.S).group(1))  # type: ignore[union-attr]
    return load_summary(summary.run_dir), data


@pytest.mark.usefixtures("takes_seconds")
def test_indistinguishable_winner_says_no_significant_difference(tmp_path: Path) -> None:
    summary, report = _uncertainty_run(tmp_path, batched_rps=100.0)
    assert summary["best"] is not None and summary["gain"] is not None
    lo, hi = summary["gain_ci"]
    assert lo <= 1.0 <= hi
    assert summary["gain_significant"] is False
    assert summary["gain_repeats"] == [3, 3] or summary["best"]["trial_number"] == -1
    assert "no significant difference" in summary["gain_text"]
    # The report's verdict says the same thing, in the same words.
    verdict = report["verdict"]
    assert verdict["gain_significant"] is False and verdict["gain_ci"] == [lo, hi]
    assert verdict["gain_text"] == summary["gain_text"]
    assert summary["gain_text"] in verdict["headline"]


@pytest.mark.usefixtures("takes_seconds")
def test_clear_win_is_significant(tmp_path: Path) -> None:
    summary, report = _uncertainty_run(tmp_path, batched_rps=300.0)
    assert summary["best"]["trial_number"] >= 0
    lo, hi = summary["gain_ci"]
    assert 2.5 < lo <= summary["gain"] <= hi < 3.5
    assert summary["gain_significant"] is True
    assert summary["gain_repeats"] == [3, 3]
    assert "no significant difference" not in summary["gain_text"]
    assert report["verdict"]["gain_significant"] is True


@pytest.mark.usefixtures("takes_seconds")
def test_a_winner_at_the_generator_s_ceiling_reads_as_a_lower_bound(tmp_path: Path) -> None:
    # The batched configs serve 1000 req/s, the generator offers 250: the winner's capacity is
    # "at least 250", so the gain is a one-sided bound, in summary.json and the report alike.
    summary, report = _uncertainty_run(tmp_path, batched_rps=1000.0, ceiling_rps=250.0)
    assert summary["best"]["trial_number"] >= 0
    lo, hi = summary["gain_ci"]
    assert hi is None and 2.0 < lo <= summary["gain"] <= 2.6
    assert summary["gain_significant"] is True
    assert summary["gain_text"].startswith(f"gain over baseline: at least {lo:.2f}x (")
    assert report["verdict"]["gain_ci"] == [lo, None]
    assert summary["gain_text"] in report["verdict"]["headline"]
    html = (tmp_path / summary["run_id"] / "report.html").read_text()
    assert f'id="gain">&ge; {lo:.2f}&times;' in html  # the gain card: a bound, not a point


@pytest.mark.usefixtures("takes_seconds")
def test_percentiles_carry_their_sample_count(tmp_path: Path) -> None:
    summary, report = _uncertainty_run(tmp_path, batched_rps=300.0)
    for side in ("baseline", "best"):
        entry = summary[side]
        # The fake's levels hold 3 s of requests: a few hundred, a low-sample p99.
        assert entry["p99_n"] is not None and 0 < entry["p99_n"] < 1000
        assert entry["p99_low_sample"] is True
        assert f"{entry['p99_n']} samples" in entry["p99_note"]
        assert report["verdict"][side]["p99_n"] == entry["p99_n"]
    assert report["verdict"]["footnotes"]
    assert all(len(c["p99_n"]) == 3 for c in summary["validation"])
    assert all(t["p99_n"] for t in report["trials"] if t["state"] == "complete")


@pytest.mark.usefixtures("takes_seconds")
def test_gpu_memory_goal_excludes_configs_on_more_instances(tmp_path: Path) -> None:
    """Planted (issue 15): memory = context + weights per instance + one arena, so a goal of
    1300 MiB fits 1 and 2 instances (at most 1228 MiB) and excludes 3 and 4 (1500 MiB and up),
    though the planted optimum without the goal is on 3 or more instances."""
    from tests.gpu.planted_gpu import GpuLoadGenerator, planted_memory_mb

    goal_mb = 1300.0
    model = PlantedModel()
    assert planted_memory_mb(Knobs(64, 0, (), 2), 64) < goal_mb
    assert goal_mb < planted_memory_mb(Knobs(1, 0, (), 3), 1)
    s = scenario(
        tmp_path,
        **{"goals.max_gpu_memory_mb": goal_mb, "budget.trials": 12, "budget.validate_top": 1},
    )
    best_knobs, _, _ = brute_force(model, space_for(s), GOAL_MS)
    assert best_knobs.instance_count >= 3, "the goal must exclude the unconstrained optimum"
    target = FakeTarget()
    summary = run_sweep(s, target=target, load=GpuLoadGenerator(target, model, noise=0.0))
    records = [load_trial_record(p) for p in summary.run_dir.glob("trials/*/measurement.json")]
    heavy = [r for r in records if r["state"] == "complete" and r["config"]["instance_count"] >= 3]
    assert heavy, "the seeds include the most instances: the planted case must be measured"
    for r in heavy:
        assert r["constraints"]["gpu_memory_slack"] > 0 and not r["meets_goals"], r["config"]
    fitting = [r for r in records if r["state"] == "complete" and r["meets_goals"]]
    assert fitting and all(r["config"]["instance_count"] <= 2 for r in fitting)
    assert summary.best is not None and summary.best.config.instance_count <= 2
    best = load_summary(summary.run_dir)["best"]
    assert best["gpus"][0]["memory_used_peak_mb"] <= goal_mb


@pytest.mark.usefixtures("takes_seconds")
def test_throughput_tie_goes_to_the_config_using_less_gpu(tmp_path: Path) -> None:
    """Planted: every batched config's capacity is 300 req/s x (1 + 0.5 % per instance), so the
    validated candidates tie within the capacity resolution (5 %) and the one on the most
    instances reads highest; at equal throughput the config holding less GPU memory wins."""
    from tests.gpu.planted_gpu import GpuLoadGenerator

    @dataclass
    class Tied(GpuLoadGenerator):
        def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
            knobs = knobs_from_config(self.target.current)
            truth = 300.0 * (1 + 0.005 * knobs.instance_count) if knobs.dynamic_batching else 50.0
            ok = self._measurement(truth, knobs, 0.5 * spec.goals.p99_ms)
            bad = self._measurement(truth * 1.05, knobs, 3 * spec.goals.p99_ms)
            return CapacityResult(spec.goals, truth, (ok, bad), ok, True)

    s = scenario(
        tmp_path,
        **{
            "budget.trials": 6,
            "budget.validate_top": 6,
            "budget.validate_repeats": 1,
            "budget.validation": "repeats",  # six candidates re-measured, ties among them
        },
    )
    target = FakeTarget()
    summary = run_sweep(s, target=target, load=Tied(target, CPU_LIKE, noise=0.0))
    data = load_summary(summary.run_dir)
    passing = [c for c in data["validation"] if c["all_meet_goals"] and c["trial_number"] >= 0]
    memory = {
        c["trial_number"]: c["measurements"][0]["best"]["server"]["gpus"][0]["memory_used_peak_mb"]
        for c in passing
    }
    assert len(set(memory.values())) > 1, "the planted candidates must differ in memory"
    most_rps = max(passing, key=lambda c: c["worst_rps"])
    assert memory[most_rps["trial_number"]] > min(memory.values())
    assert data["best"]["trial_number"] == min(memory, key=lambda n: memory[n])
    assert data["tie_break"] and "less GPU memory" in data["tie_break"]
