"""Which stateful models perfsweep tunes (``target.untunable_reason``), how it searches them
(``strategy.resolve``), and the bundled accumulator's repository."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.scenario import load_scenario
from analyzer.errors import TargetError
from analyzer.search.strategy import resolve
from analyzer.target.managed import bundled_repository
from analyzer.target.protocol import untunable_reason
from reference_server.core.config import load_config_file
from reference_server.zoo.accumulator import accumulator_config


def test_the_oldest_strategy_is_tunable() -> None:
    assert untunable_reason(accumulator_config("acc")) is None


def test_the_direct_strategy_is_refused_with_what_is_supported() -> None:
    for config in (
        accumulator_config("acc", oldest=False),
        # No strategy named: Triton's default, direct.
        mc.ModelConfig(name="acc", max_batch_size=8, sequence_batching=mc.ModelSequenceBatching()),
    ):
        reason = untunable_reason(config)
        assert reason is not None
        assert "sequence-batched" in reason and "direct strategy has no batching delay" in reason
        assert "use oldest" in reason and "max_candidate_sequences" in reason


def test_an_ensemble_is_refused_with_what_can_be_tuned() -> None:
    ensemble = mc.ModelConfig(name="ens", platform="ensemble", max_batch_size=8)
    ensemble.ensemble_scheduling.step.add(model_name="inner", model_version=-1)
    for config in (ensemble, mc.ModelConfig(name="ens", platform="ensemble")):
        reason = untunable_reason(config)
        assert reason is not None
        # Where one model is tuned (the probe, the dashboard): the sweep tunes it as a pipeline.
        assert "an ensemble" in reason and "tune a composing model by name" in reason
        assert "perfsweep run --model ens" in reason


def test_a_stateless_model_is_tunable() -> None:
    config = mc.ModelConfig(name="m", max_batch_size=8)
    config.dynamic_batching.max_queue_delay_microseconds = 100
    assert untunable_reason(config) is None


def test_predict_falls_back_to_tpe_for_a_sequence_model(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[model]\nname = "acc"\n[search]\nstrategy = "predict"\n')
    scenario = load_scenario(path, env={})
    assert resolve(scenario) == ("predict", None)
    stateless = mc.ModelConfig(name="acc", max_batch_size=8)
    assert resolve(scenario, stateless) == ("predict", None)
    strategy, why = resolve(scenario, accumulator_config("acc"))
    assert strategy == "tpe"
    assert why is not None and "sequence batcher" in why and "tpe" in why
    # A strategy asked for by name is kept: only predict needs the simulator.
    path.write_text('[model]\nname = "acc"\n[search]\nstrategy = "random"\n')
    assert resolve(load_scenario(path, env={}), accumulator_config("acc")) == ("random", None)


@pytest.mark.usefixtures("spawns")
def test_the_bundled_accumulator_repository(tmp_path: Path) -> None:
    root = bundled_repository("accumulator", tmp_path / "repository", "sim")
    config = load_config_file(root / "accumulator" / "config.pbtxt")
    assert config.sequence_batching.HasField("oldest")
    assert untunable_reason(config) is None
    assert (root / "accumulator" / "1").is_dir()
    with pytest.raises(TargetError, match="--device sim"):
        bundled_repository("accumulator", tmp_path / "other", "cpu")
