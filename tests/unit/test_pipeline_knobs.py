"""A pipeline's knobs, its space and the configs they make (pure: no server)."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import Knobs
from analyzer.config.pipeline import (
    JointKnobs,
    Tuned,
    ensemble_steps,
    knob_cells,
    knobs_from_dict,
    stage_refusal,
)
from analyzer.report.record import knob_of_param
from analyzer.rundir.results import trial_row
from analyzer.search.space import JointSpace, SearchSpace


def _stage(name: str, mbs: int = 8) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, backend="simulated", max_batch_size=mbs)
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    config.dynamic_batching.SetInParent()
    return config


def _ensemble(*steps: str) -> mc.ModelConfig:
    config = mc.ModelConfig(name="pipe", platform="ensemble", max_batch_size=4)
    for model in steps:
        config.ensemble_scheduling.step.add(model_name=model, model_version=-1)
    return config


def _space(lo: int = 2, hi: int = 4) -> SearchSpace:
    return SearchSpace(log2_mbs=(lo, hi), delays_us=(0, 1000), instances=(1, 2))


def test_joint_knobs_round_trip_through_their_dict() -> None:
    knobs = JointKnobs((("pre", Knobs(8, 0, (), 1)), ("infer", Knobs(16, 500, (16, 8), 2))))
    assert knobs_from_dict(knobs.to_dict()) == knobs
    assert knobs_from_dict(Knobs(8).to_dict()) == Knobs(8)
    assert knobs.instance_count == 3 and knobs.dynamic_batching
    assert knobs.label().startswith("pre: mbs=8 ") and " | infer: mbs=16 " in knobs.label()
    assert knob_cells(knobs) == ("8/16", "0/500", "-/16 8", "1/2")
    with pytest.raises(ValueError, match="distinct"):
        JointKnobs((("pre", Knobs(8)), ("pre", Knobs(4))))


def test_the_joint_space_prefixes_each_stage_and_decodes_what_it_encodes() -> None:
    space = JointSpace((("pre", _space()), ("infer", _space(3, 5))))
    bounds = space.param_bounds()
    assert bounds["pre.log2_mbs"] == (2, 4) and bounds["infer.log2_mbs"] == (3, 5)
    assert space.size() == _space().size() * _space(3, 5).size()
    assert len(list(space.points())) == space.size()
    params = {"pre.log2_mbs": 3, "pre.instances": 2, "infer.delay_idx": 1}
    knobs = space.decode(params)
    assert knobs.stage("pre") == Knobs(8, 0, (), 2)
    assert knobs.stage("infer").max_queue_delay_us == 1000
    assert space.decode(space.encode(knobs)) == knobs
    with pytest.raises(ValueError):
        space.encode(Knobs(8))


def test_joint_seeds_zip_each_stage_s_seeds_with_the_goal_split_among_stages() -> None:
    space = JointSpace((("pre", _space()), ("infer", _space())))
    start = JointKnobs((("pre", Knobs(4)), ("infer", Knobs(16, 0, (), 2))))
    seeds = space.seeds(start, p99_goal_ms=8.0)
    assert seeds[0] == start  # the pipeline as found first
    assert len(set(seeds)) == len(seeds) >= 3
    # A stage's quarter-of-the-goal seed uses its share of the goal: 8 ms / 2 stages / 4.
    assert any(s.stage("infer").max_queue_delay_us == 1000 for s in seeds)


def test_tuned_sets_each_composing_model_and_leaves_the_ensemble_alone() -> None:
    stages = [_stage("pre"), _stage("infer", 16)]
    tuned = Tuned.of(_ensemble("pre", "infer"), stages)
    assert tuned.pipeline and tuned.names == ("pre", "infer")
    assert tuned.knobs() == JointKnobs((("pre", Knobs(8)), ("infer", Knobs(16))))
    wanted = JointKnobs((("pre", Knobs(4, 100, (2,), 2)), ("infer", Knobs(8, 0, (), 3))))
    configs = tuned.configs(wanted)
    assert [c.name for c in configs] == ["pre", "infer"]
    assert configs[0].dynamic_batching.max_queue_delay_microseconds == 100
    assert configs[1].instance_group[0].count == 3
    assert tuned.knobs_of(configs) == wanted
    with pytest.raises(ValueError):
        tuned.configs(Knobs(8))
    single = Tuned(_stage("m"))
    assert single.names == ("m",) and single.configs(Knobs(4))[0].max_batch_size == 4


def test_composing_models_that_cannot_be_tuned_are_named_with_what_to_do() -> None:
    ensemble = _ensemble("pre", "pre", "post")
    assert ensemble_steps(ensemble) == ("pre", "post")
    decoupled = _stage("talk")
    decoupled.model_transaction_policy.decoupled = True
    stateful = _stage("state")
    stateful.sequence_batching.SetInParent()
    nested = _ensemble("x")
    flat = _stage("flat", 0)
    for config, needle in [
        (decoupled, "decoupled"),
        (stateful, "sequence-batched"),
        (nested, "itself an ensemble"),
        (flat, "max_batch_size 0"),
    ]:
        why = stage_refusal("step 2 of ensemble 'pipe'", config)
        assert why is not None and needle in why and "step 2 of ensemble 'pipe'" in why
        assert "--composing-models" in why
    assert stage_refusal("step 1", _stage("fine")) is None


def test_trials_csv_and_importances_name_each_stage() -> None:
    knobs = JointKnobs((("pre", Knobs(8, 0, (8, 4), 1)), ("infer", Knobs(16, 500, (), 2))))
    row = trial_row({"number": 3, "config": knobs.to_dict()})
    assert row["max_batch_size"] == "8/16" and row["instance_count"] == "1/2"
    assert row["preferred_batch_size"] == "8 4/"
    single = trial_row({"number": 1, "config": Knobs(8, 0, (8,), 2).to_dict()})
    assert single["max_batch_size"] == 8 and single["preferred_batch_size"] == "8"
    assert knob_of_param("infer.log2_mbs") == "infer: max_batch_size"
    assert knob_of_param("pre.instances_1") == "pre: instance_count (group 1)"
