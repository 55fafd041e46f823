"""The mix's simulator: several models' batchers and instances on one device."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from analyzer.config.knobs import Knobs
from analyzer.config.pipeline import JointKnobs
from analyzer.errors import InputError
from analyzer.measure.arrivals import POISSON
from analyzer.predict.mix_sim import (
    MixModel,
    MixProfile,
    mix_capacities,
    mix_capacity,
    mix_offsets,
    simulate_mix,
)
from analyzer.predict.profile import BatchTiming, Profile
from analyzer.predict.sim_records import SimConfig
from analyzer.predict.simulator import simulate
from analyzer.search.predictors import MIX_KEEP, MixPredictor, ModelPredictor, load_predictor
from analyzer.search.space import JointSpace, SearchSpace, grid_configs
from analyzer.search.strategy import Guide


def planted(name: str, a_ms: float, b_ms: float, host_ms: float = 0.0) -> Profile:
    """``a_ms + b_ms`` per item on the device, ``host_ms`` before and after it (overlapping)."""
    return Profile(
        model=name,
        provenance="planted test profile",
        source="test",
        timings=tuple(BatchTiming(s, host_ms, a_ms + b_ms * s, host_ms) for s in range(1, 33)),
    )


# The mix benchmarks' models (benchmarks/mixes.py): rank heavy with a loose goal, tag cheap with a
# tight one, embed between; 3:4:2.
RANK = MixModel("rank", planted("rank", 16.0, 1.0, 8.0), 3, 400.0)
TAG = MixModel("tag", planted("tag", 2.0, 0.2), 4, 40.0)
EMBED = MixModel("embed", planted("embed", 6.0, 0.6), 2, 120.0)
THREE = MixProfile((RANK, TAG, EMBED))

# Each model's best alone (rank: its largest batches on two instances, overlapping its host
# work), and the models' best together (rank on one instance, smaller batches).
SOLO = {"rank": SimConfig(32, 0, (), 2), "tag": SimConfig(4), "embed": SimConfig(16)}
JOINT = {"rank": SimConfig(8, 0, (8, 4), 1), "tag": SimConfig(32), "embed": SimConfig(16)}


def test_a_mix_of_one_model_simulates_as_the_model_alone() -> None:
    alone = MixProfile((RANK,))
    mixed = simulate_mix(alone, {"rank": SOLO["rank"]}, 150.0, requests=3000, seed=3)
    direct = simulate(RANK.profile, SOLO["rank"], 150.0, requests=3000, seed=3)
    assert mixed.models["rank"] == direct
    assert mixed.combined.p99_ms == direct.p99_ms


def test_the_device_is_shared_one_models_executions_are_the_others_wait() -> None:
    # Two unbatched models of 10 ms device time each: alone, 60 req/s uses 60 % of the device;
    # together at 60 req/s each, the device would need 120 %.
    a = MixModel("a", planted("a", 10.0, 0.0), 1, 1000.0)
    b = MixModel("b", planted("b", 10.0, 0.0), 1, 1000.0)
    unbatched = SimConfig(1, dynamic_batching=False)
    one = simulate_mix(MixProfile((a,)), {"a": unbatched}, 60.0, requests=4000, seed=1)
    both = simulate_mix(MixProfile((a, b)), {"a": unbatched, "b": unbatched}, 120.0, requests=8000)
    assert not one.models["a"].saturated
    assert both.combined.saturated
    # The noise-free bound of the pair is the device's: 100 req/s of the mix.
    assert MixProfile((a, b)).peak_rps({"a": unbatched, "b": unbatched}) == pytest.approx(100.0)


def test_each_model_is_drawn_by_its_share_at_its_part_of_the_rate() -> None:
    predicted = simulate_mix(THREE, JOINT, 90.0, requests=9000, seed=2)
    assert predicted.models["tag"].rate_rps == pytest.approx(40.0)
    counted = {name: p.requests for name, p in predicted.models.items()}
    total = sum(counted.values())
    assert counted["tag"] / total == pytest.approx(4 / 9, abs=0.02)
    assert counted["rank"] / total == pytest.approx(3 / 9, abs=0.02)


def test_the_solo_answers_together_miss_the_tight_goal_where_the_joint_answer_meets_all() -> None:
    # What the three-model comparison (benchmarks/mix_solo_vs_joint.py) measured on the
    # reference server at 125 req/s (solo: tag 51.8 ms against its 40; joint: tag 29.1, embed
    # 30.1, rank 80.5).
    solo = simulate_mix(THREE, SOLO, 125.0, requests=6000, seed=1)
    joint = simulate_mix(THREE, JOINT, 125.0, requests=6000, seed=1)
    assert solo.misses(THREE) == ["tag"]
    assert joint.misses(THREE) == []
    assert solo.models["tag"].p99_ms > 45.0
    assert joint.models["tag"].p99_ms < 35.0
    # The combined p99 puts the model nearest its goal on the loosest goal's scale.
    worst = max(joint.models[m.name].p99_ms / m.p99_ms for m in THREE.models)
    assert joint.combined.p99_ms == pytest.approx(worst * 400.0)


def test_the_capacity_of_a_mix_holds_every_model_to_its_own_goal() -> None:
    solo, joint = mix_capacities(THREE, [SOLO, JOINT], requests=3000, seed=1)
    assert joint.capacity_rps > 3 * solo.capacity_rps
    at = simulate_mix(THREE, JOINT, joint.capacity_rps, requests=3000, seed=1)
    assert at.misses(THREE) == []
    above = simulate_mix(THREE, JOINT, joint.capacity_rps * 1.1, requests=3000, seed=1)
    assert above.misses(THREE)
    # A warm start gives the same answer (to the search's resolution).
    again = mix_capacity(THREE, JOINT, requests=3000, seed=1, start_rps=solo.capacity_rps)
    assert again.capacity_rps == pytest.approx(joint.capacity_rps, rel=0.03)


def test_a_stop_shortcut_reports_no_figures() -> None:
    stopped = simulate_mix(THREE, SOLO, 400.0, requests=3000, seed=1, stop=True)
    assert stopped.combined.stopped_early
    assert math.isinf(stopped.combined.p99_ms)


def test_offsets_are_calibrated_per_model_on_measured_points() -> None:
    sim = simulate_mix(THREE, JOINT, 125.0, requests=3000, seed=0)
    measured = {"rank": sim.models["rank"].p99_ms + 5.0, "tag": sim.models["tag"].p99_ms + 1.0}
    calibrated = mix_offsets(THREE, [(JOINT, 125.0, measured)], requests=3000, seed=0)
    offsets = {m.name: m.profile.latency_offset_ms for m in calibrated.models}
    assert offsets == {"rank": pytest.approx(5.0), "tag": pytest.approx(1.0), "embed": 0.0}


def test_a_mix_refuses_repeated_models_and_missing_configs() -> None:
    with pytest.raises(InputError, match="distinct"):
        MixProfile((RANK, RANK))
    with pytest.raises(InputError, match="embed"):
        simulate_mix(THREE, {"rank": SOLO["rank"], "tag": SOLO["tag"]}, 50.0)


def _mix_space() -> JointSpace:
    space = SearchSpace(log2_mbs=(2, 5), delays_us=(0,), max_pref_depth=1, instances=(1, 2))
    return JointSpace(tuple((m.name, space) for m in THREE.models))


def test_the_predictor_searches_the_joint_space_past_each_models_best_alone() -> None:
    predictor = MixPredictor(THREE)
    space = _mix_space()
    candidates = predictor.candidates(space, THREE.goal_p99_ms, seed=0)
    assert 0 < len(candidates) <= MIX_KEEP < space.size()
    assert all(isinstance(k, JointKnobs) and predictor.covers(k) for k in candidates)
    guide = Guide.predict(predictor, candidates, THREE.goal_p99_ms, 0.1)
    best, prediction = guide.best() or (None, None)
    assert isinstance(best, JointKnobs) and prediction is not None
    # Alone, rank's best is its largest batches on two instances; beside tag's tight goal the
    # mix is served best with rank on one instance.
    alone = ModelPredictor(RANK.profile)
    rank_configs = [k for k in grid_configs(space.stages[0][1]) if isinstance(k, Knobs)]
    solo = alone.capacities(
        rank_configs,
        RANK.p99_ms,
        requests=1000,
        seed=0,
        resolution=0.05,
        workers=1,
        ceiling_rps=math.inf,
        arrival=POISSON,
    )
    assert max(rank_configs, key=lambda k: solo[k]).instance_count == 2
    assert best.stage("rank").instance_count == 1
    solo_answers = guide.forecast(
        JointKnobs(
            (
                ("rank", Knobs(32, instance_count=2)),
                ("tag", Knobs(4)),
                ("embed", Knobs(16)),
            )
        )
    )
    assert solo_answers is not None
    assert prediction.capacity_rps > 2 * solo_answers.capacity_rps


def test_a_mix_predictor_covers_only_the_mixs_configs_and_loads_back(tmp_path: Path) -> None:
    predictor = MixPredictor(THREE)
    joint = JointKnobs(tuple((m.name, Knobs(16)) for m in THREE.models))
    assert predictor.covers(joint)
    assert not predictor.covers(Knobs(16))
    assert not predictor.covers(JointKnobs((("rank", Knobs(16)),)))
    assert not predictor.covers(JointKnobs(tuple((m.name, Knobs(64)) for m in THREE.models)))
    predictor.save(tmp_path / "profile.json")
    assert load_predictor(tmp_path / "profile.json") == predictor
    summary = predictor.summary(0)
    assert summary["mix"] == {
        "rank": {"share": 3, "p99_ms": 400.0},
        "tag": {"share": 4, "p99_ms": 40.0},
        "embed": {"share": 2, "p99_ms": 120.0},
    }


@pytest.mark.usefixtures("spawns")
def test_the_joint_search_gives_the_same_answers_in_worker_processes() -> None:
    space = _mix_space()
    serial = MixPredictor(THREE).candidates(space, THREE.goal_p99_ms, seed=0)
    assert MixPredictor(THREE, workers=2).candidates(space, THREE.goal_p99_ms, seed=0) == serial


def test_a_point_the_simulation_puts_over_a_goal_calibrates_nothing() -> None:
    # Unbatched, rank is near saturation at 100 req/s of the mix: its simulated p99 is far
    # above its goal, where a few percent of rate move it by seconds.
    unbatched = {m.name: SimConfig(32, dynamic_batching=False) for m in THREE.models}
    sim = simulate_mix(THREE, unbatched, 100.0, requests=3000, seed=0)
    assert "rank" in sim.misses(THREE)
    measured = {"rank": 350.0, "tag": 20.0, "embed": 25.0}
    assert mix_offsets(THREE, [(unbatched, 100.0, measured)], requests=3000, seed=0) == THREE


def test_models_at_rates_of_their_own_hold_them_while_the_rest_is_scaled() -> None:
    # Maximise rank's rate while tag and embed hold theirs.
    held = MixProfile(
        (
            RANK,
            replace(TAG, share=0.0, rate_rps=60.0),
            replace(EMBED, share=0.0, rate_rps=30.0),
        )
    )
    assert held.fixed_rps() == 90.0
    for rate in (120.0, 200.0):
        at = simulate_mix(held, JOINT, rate, requests=6000, seed=1)
        assert at.models["tag"].rate_rps == pytest.approx(60.0)
        assert at.models["rank"].rate_rps == pytest.approx(rate - 90.0)
        counted = {name: p.requests for name, p in at.models.items()}
        assert counted["tag"] / sum(counted.values()) == pytest.approx(60.0 / rate, abs=0.02)
    capacity = mix_capacity(held, JOINT, requests=3000, seed=1)
    assert 90.0 < capacity.capacity_rps <= held.peak_rps(JOINT)
    assert (
        simulate_mix(held, JOINT, capacity.capacity_rps, requests=3000, seed=1).misses(held) == []
    )
    with pytest.raises(ValueError, match="leaves nothing"):
        simulate_mix(held, JOINT, 80.0)
    with pytest.raises(InputError, match="share"):
        MixProfile((replace(RANK, share=0.0, rate_rps=10.0), replace(TAG, share=0.0, rate_rps=5.0)))
