"""The pipeline simulator and the predictor that searches a pipeline's joint space (pure)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from analyzer.config.knobs import Knobs
from analyzer.config.pipeline import JointKnobs
from analyzer.measure.arrivals import parse_arrival
from analyzer.predict.capacity import capacity
from analyzer.predict.pipeline_sim import (
    PipelineProfile,
    pipeline_capacity,
    pipeline_offset,
    simulate_pipeline,
)
from analyzer.predict.sim_records import SimConfig
from analyzer.predict.simulator import simulate
from analyzer.predict.sources import from_toml
from analyzer.search.predictors import (
    STAGE_KEEP,
    ModelPredictor,
    PipelinePredictor,
    goal_shares,
    load_predictor,
)
from analyzer.search.space import JointSpace, SearchSpace
from analyzer.search.strategy import Guide

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline"
STAGES = ("pre", "infer", "post")


def _pipeline() -> PipelineProfile:
    return PipelineProfile(
        tuple(
            (name, from_toml(EXAMPLE / name / "profile.toml", max_batch_size=16, model=name))
            for name in STAGES
        )
    )


def _configs(infer: SimConfig) -> dict[str, SimConfig]:
    return {"pre": SimConfig(16), "infer": infer, "post": SimConfig(16)}


def test_a_one_stage_pipeline_simulates_as_the_model_alone() -> None:
    infer = dict(_pipeline().stages)["infer"]
    config = SimConfig(16, 2000, (), 2)
    alone = simulate(infer, config, 150.0, requests=4000)
    piped = simulate_pipeline(
        PipelineProfile((("infer", infer),)), {"infer": config}, 150.0, requests=4000
    )
    assert (piped.p99_ms, piped.p50_ms, piped.throughput_rps) == (
        alone.p99_ms,
        alone.p50_ms,
        alone.throughput_rps,
    )
    assert piped.stage_batch_sizes == {"infer": alone.batch_sizes}


def test_at_a_light_constant_load_a_request_takes_every_stage_in_turn() -> None:
    pipeline = _pipeline()
    # Each request alone at every stage: its latency is the three executions of batch 1.
    pred = simulate_pipeline(
        pipeline, _configs(SimConfig(16)), 5.0, requests=200, arrival=parse_arrival("constant")
    )
    one_each = sum(p.timing(1).total_ms for _, p in pipeline.stages)
    assert pred.p50_ms == pytest.approx(one_each, abs=0.01)
    assert pred.p99_ms == pytest.approx(one_each, abs=0.01)
    assert {name: sizes for name, sizes in pred.stage_batch_sizes.items()} == {
        name: {1: 200} for name in STAGES
    }
    shifted = replace(pipeline, latency_offset_ms=3.0)
    later = simulate_pipeline(
        shifted, _configs(SimConfig(16)), 5.0, requests=200, arrival=parse_arrival("constant")
    )
    assert later.p99_ms == pytest.approx(pred.p99_ms + 3.0)


def test_the_slowest_stage_bounds_the_pipeline_and_batching_it_raises_capacity() -> None:
    pipeline = _pipeline()
    infer = dict(pipeline.stages)["infer"]
    unbatched = SimConfig(16, dynamic_batching=False)
    batched = SimConfig(16)
    for config in (unbatched, batched):
        whole = pipeline_capacity(pipeline, _configs(config), 150.0)
        alone = capacity(infer, config, 150.0)
        # The other stages add latency and queueing: never more than the stage alone.
        assert 0 < whole.capacity_rps <= alone.capacity_rps * 1.02
    # 20 ms + 2 ms an item: one request at a time serves at most 45 req/s; batches, far more.
    low = pipeline_capacity(pipeline, _configs(unbatched), 150.0).capacity_rps
    high = pipeline_capacity(pipeline, _configs(batched), 150.0).capacity_rps
    assert low < 1000 / 22 < 3 * low < high


def test_a_rate_beyond_the_goal_stops_early_and_predicts_no_latency() -> None:
    pred = simulate_pipeline(
        _pipeline(), _configs(SimConfig(16, dynamic_batching=False)), 200.0, stop_above_ms=50.0
    )
    assert pred.stopped_early and math.isinf(pred.p99_ms) and pred.saturated


def test_the_offset_is_what_the_measurements_add_to_the_simulated_p99() -> None:
    pipeline = _pipeline()
    configs = _configs(SimConfig(16))
    simulated = simulate_pipeline(pipeline, configs, 60.0, requests=3000).p99_ms
    offset = pipeline_offset(pipeline, [(configs, 60.0, simulated + 4.0)])
    assert offset == pytest.approx(4.0)
    assert pipeline_offset(pipeline, [(configs, 60.0, math.inf)]) is None


def _joint_space() -> JointSpace:
    space = SearchSpace(log2_mbs=(2, 4), delays_us=(0, 4000), instances=(1, 2))
    return JointSpace(tuple((name, space) for name in STAGES))


def test_the_joint_space_is_pruned_stage_by_stage_before_the_pipeline_is_simulated() -> None:
    predictor = PipelinePredictor(_pipeline())
    space = _joint_space()
    candidates = predictor.candidates(space, 150.0, seed=0)
    assert len(candidates) == STAGE_KEEP ** len(STAGES) < space.size()
    assert all(predictor.covers(k) for k in candidates)
    # The GPU-like stage keeps batching configs: alone at its share of the goal, one request at
    # a time is its worst.
    kept_infer = {k.stage("infer") for k in candidates}
    assert all(k.max_batch_size >= 4 for k in kept_infer)
    guide = Guide.predict(predictor, candidates, 150.0, 0.1)
    best, prediction = guide.best() or (None, None)
    assert isinstance(best, JointKnobs) and prediction is not None
    assert prediction.capacity_rps > 100
    assert guide.record().configs[0].config == candidates[0]


def test_the_goal_is_shared_in_proportion_to_each_stages_execution_time() -> None:
    pipeline = _pipeline()
    shares = goal_shares(pipeline, 150.0)
    assert sum(shares.values()) == pytest.approx(150.0)
    # infer takes 22.6 ms for one request, pre and post 1.22 ms: infer gets most of the budget.
    assert shares["infer"] == pytest.approx(150.0 * 22.6 / (22.6 + 2 * 1.22), rel=1e-3)
    assert shares["pre"] == pytest.approx(shares["post"])
    infer = dict(pipeline.stages)["infer"]
    even = PipelineProfile((("a", infer), ("b", infer)))
    assert goal_shares(even, 100.0) == {"a": 50.0, "b": 50.0}


def test_a_predictor_covers_only_configs_of_its_own_kind() -> None:
    pipeline = _pipeline()
    joint = JointKnobs(tuple((name, Knobs(16)) for name in STAGES))
    assert PipelinePredictor(pipeline).covers(joint)
    assert not PipelinePredictor(pipeline).covers(Knobs(16))
    assert not PipelinePredictor(pipeline).covers(JointKnobs((("pre", Knobs(16)),)))
    assert not PipelinePredictor(pipeline).covers(
        JointKnobs(tuple((name, Knobs(32)) for name in STAGES))  # beyond the profiled 16
    )
    assert not ModelPredictor(pipeline.stages[0][1]).covers(joint)


def test_a_saved_predictor_loads_back(tmp_path: Path) -> None:
    pipeline = replace(_pipeline(), latency_offset_ms=2.5)
    PipelinePredictor(pipeline).save(tmp_path / "profile.json")
    assert load_predictor(tmp_path / "profile.json") == PipelinePredictor(pipeline)
    one = ModelPredictor(pipeline.stages[1][1])
    one.save(tmp_path / "one.json")
    assert load_predictor(tmp_path / "one.json") == one
