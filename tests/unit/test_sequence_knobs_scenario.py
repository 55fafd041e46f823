"""``space.max_candidate_sequences`` (analyzer.config.scenario, the sweep's space) and the bundled
accumulator scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.scenario import SCENARIO_DIR, Scenario, bundled_scenario, load_scenario
from analyzer.errors import InputError, ScenarioError
from analyzer.sweep.loop import space_for
from reference_server.zoo.accumulator import accumulator_config


def test_the_bundled_scenario_is_chosen_by_model_and_searches_the_oldest_strategy() -> None:
    path = bundled_scenario("accumulator", "sim")
    assert path == SCENARIO_DIR / "accumulator.sim.toml"
    scenario = load_scenario(path, env={})
    assert (scenario.model.name, scenario.model.device) == ("accumulator", "sim")
    assert scenario.space.max_candidate_sequences == (4, 8, 16)
    assert scenario.space.max_queue_delay_us[1] > 0
    assert scenario.space.response_cache is None
    assert scenario.budget.trials <= 10 and scenario.budget.time_budget_s is not None


def test_space_max_candidate_sequences_is_validated_and_hashed_only_when_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[model]\nname = "acc"\n')
    plain = load_scenario(path, env={})
    assert plain.space.max_candidate_sequences is None
    # Unset, it hashes as a scenario from before the field existed.
    with monkeypatch.context() as patch:
        dump = Scenario.to_dict

        def older(self: Scenario) -> dict[str, Any]:
            data = dump(self)
            del data["space"]["max_candidate_sequences"]
            return data

        patch.setattr(Scenario, "to_dict", older)
        before = plain.hash()
    assert plain.hash() == before
    path.write_text('[model]\nname = "acc"\n[space]\nmax_candidate_sequences = [8]\n')
    searched = load_scenario(path, env={})
    assert searched.space.max_candidate_sequences == (8,)
    assert searched.hash() != plain.hash()
    for bad in ("[]", "[0, 4]"):
        path.write_text(f'[model]\nname = "acc"\n[space]\nmax_candidate_sequences = {bad}\n')
        with pytest.raises(ScenarioError, match="max_candidate_sequences"):
            load_scenario(path, env={})


def test_the_sweep_space_searches_the_scenario_candidates(tmp_path: Path) -> None:
    scenario = load_scenario(bundled_scenario("accumulator", "sim"), env={})
    space = space_for(scenario, accumulator_config())
    assert space.candidate_choices == (4, 8, 16)
    assert space.param_bounds()["cand_idx"] == (0, 2)
    plain = space_for(load_scenario(None, env={}), accumulator_config())
    assert plain.candidate_choices == (None,) and "cand_idx" not in plain.param_bounds()
    with pytest.raises(InputError, match="oldest strategy"):
        space_for(scenario, mc.ModelConfig(name="stateless", max_batch_size=8))
