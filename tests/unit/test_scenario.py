"""Scenario: TOML + PERFSWEEP_* + flags, unknown keys named, cross-field checks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from analyzer.config.scenario import (
    HASH_VERSION,
    SCENARIO_DIR,
    Scenario,
    bundled_scenario,
    env_overrides,
    hash_version,
    load_scenario,
)
from analyzer.errors import ScenarioError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


def test_bundled_scenarios_load_and_differ_by_device() -> None:
    default = load_scenario(bundled_scenario("resnet50"), env={})
    sim = load_scenario(bundled_scenario("resnet50", "sim"), env={})
    assert default.model.device == "auto"
    assert sim.model.device == "sim"
    assert bundled_scenario("resnet50", "cpu") == SCENARIO_DIR / "resnet50.toml"
    assert bundled_scenario("no-such-model") is None


def test_layers_flags_beat_env_beat_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[goals]\np99_ms = 10\n[budget]\ntrials = 3\n")
    env = {"PERFSWEEP_GOALS_P99_MS": "20", "PERFSWEEP_BUDGET_TRIALS": "4", "PERFSWEEP_HOME": "x"}
    s = load_scenario(path, {"goals.p99_ms": 30.0, "budget.trials": None}, env=env)
    assert s.goals.p99_ms == 30.0  # flag wins
    assert s.budget.trials == 4  # env beats file; a None flag means "not given"


def test_env_values_parse_as_toml() -> None:
    parsed = env_overrides(
        {"PERFSWEEP_SPACE_MAX_BATCH_SIZE": "[2, 8]", "PERFSWEEP_OBJECTIVE": "latency", "OTHER": "1"}
    )
    assert parsed == {"space.max_batch_size": [2, 8], "objective": "latency"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[goals]\np99 = 3\n", "unknown key 'goals.p99'"),
        ("colour = 'red'\n", "unknown key 'colour'"),
        (
            "[space]\nmax_batch_size = [1, 8]\npreferred_batch_size = [16]\n",
            "preferred size 16 is above",
        ),
        ("[goals]\np99_ms = 0\n", "goals.p99_ms"),
        ("[goals]\np99_ms = -5\n", "greater than 0"),
        ("[space]\nmax_batch_size = [1, 12]\n", "powers of two"),
        ("[model]\nurl = 'ftp://host'\n", "model.url must start with http"),
        ("objective = 'latency'\n", "needs traffic.rate_rps"),
        (
            "objective = 'lat'\n",
            "objective: unknown objective 'lat'; use one of 'throughput', 'latency', 'pareto'",
        ),
        (
            "objective = 'latency'\n[traffic]\nmode = 'concurrency'\n",
            "in closed-loop mode needs traffic.concurrency",
        ),
        ("[run]\nstorage = 'postgresql://x/y'\n", "needs run.study_name"),
        (
            "objective = 'pareto'\n[traffic]\narrival = ['poisson', 'gamma:cv=2']\n",
            'objective "pareto" measures one arrival shape',
        ),
        ("[goals\n", "not valid TOML"),
    ],
)
def test_bad_scenarios_are_one_line_errors_naming_the_problem(
    tmp_path: Path, text: str, needle: str
) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(write(tmp_path, text), env={})
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_unknown_env_or_flag_key_in_known_section_is_an_error() -> None:
    with pytest.raises(ScenarioError, match="PERFSWEEP_GOALS_P99"):
        load_scenario(None, env={"PERFSWEEP_GOALS_P99": "5"})
    with pytest.raises(ScenarioError, match=r"unknown key 'budget\.trails'"):
        load_scenario(None, {"budget.trails": 5}, env={})


def test_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario(tmp_path / "nope.toml", env={})


def test_toml_round_trip_and_hash_are_stable(tmp_path: Path) -> None:
    s = load_scenario(
        None,
        {
            "goals.p99_ms": 12.5,
            "space.preferred_batch_size": [8, 4],
            "traffic.rate_rps": 40.0,
            "objective": "latency",
            "run.output_dir": "out",
        },
        env={},
    )
    again = load_scenario(write(tmp_path, s.to_toml()), env={})
    assert again == s
    assert again.hash() == s.hash()
    assert s.hash() != Scenario().hash()


def test_scenario_is_frozen() -> None:
    s = Scenario()
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error type is internal
        s.goals.p99_ms = 1.0  # type: ignore[misc]


def test_search_strategy_is_in_the_hash_and_keys_at_their_defaults_are_not() -> None:
    base = load_scenario(None, {"budget.sequential": False, "budget.validation": "repeats"}, env={})
    tpe = load_scenario(
        None,
        {
            "budget.sequential": False,
            "budget.validation": "repeats",
            "search.strategy": "tpe",
            "search.band": 0.2,
        },
        env={},
    )
    grid = load_scenario(
        None,
        {"budget.sequential": False, "budget.validation": "repeats", "search.strategy": "grid"},
        env={},
    )
    assert base.search.strategy == "predict"
    assert len({base.hash(), tpe.hash(), grid.hash()}) == 3
    # The hashed document is the hash version and the keys off their defaults, nothing else
    # (sequential_max_requests measures nothing with sequential steps off).
    document = {
        "hash_version": HASH_VERSION,
        "budget": {"sequential": False, "validation": "repeats"},
        "search": {"band": 0.2, "strategy": "tpe"},
    }
    digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]
    assert tpe.hash() == f"v{HASH_VERSION}-{digest}"
    assert hash_version(tpe.hash()) == HASH_VERSION == 2
    assert hash_version("0123456789abcdef") == 1  # the hashes written before the version
    with pytest.raises(ScenarioError, match="strategy"):
        load_scenario(None, {"search.strategy": "bayes"}, env={})


def test_a_key_added_with_its_default_leaves_every_hash_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scenarios = [
        Scenario(),
        load_scenario(None, {"model.server": "triton", "space.response_cache": "search"}, env={}),
        load_scenario(None, {"traffic.rate_rps": 40.0, "goals.max_gpu_memory_mb": 900}, env={}),
    ]
    before = [s.hash() for s in scenarios]
    dump = Scenario.to_dict

    def newer(self: Scenario) -> dict[str, Any]:
        data = dump(self)
        data["space"]["a_new_knob"] = None
        data["budget"]["a_new_limit"] = 3
        data["a_new_section"] = {"enabled": False}
        return data

    monkeypatch.setattr(Scenario, "to_dict", newer)
    assert [s.hash() for s in scenarios] == before
    assert len(set(before)) == 3


def test_server_kind_is_in_the_hash_and_the_binary_path_is_not() -> None:
    reference = load_scenario(None, {}, env={})
    triton = load_scenario(None, {"model.server": "triton"}, env={})
    elsewhere = load_scenario(
        None,
        {"model.server": "triton", "model.triton_server_path": "/opt/bin/tritonserver"},
        env={},
    )
    assert triton.model.server == "triton"
    assert elsewhere.model.triton_server_path == Path("/opt/bin/tritonserver")
    assert reference.hash() != triton.hash()
    assert triton.hash() == elsewhere.hash()
    with pytest.raises(ScenarioError, match=r"model\.server"):
        load_scenario(None, {"model.server": "tgi"}, env={})


def test_the_response_cache_setting_reaches_the_space_and_the_hash_only_when_set() -> None:
    from analyzer.sweep.loop import space_for

    plain = load_scenario(None, {}, env={})
    searched = load_scenario(None, {"space.response_cache": "search"}, env={})
    bigger = load_scenario(
        None, {"space.response_cache": "search", "model.cache_size_bytes": 2**30}, env={}
    )
    sized_off = load_scenario(None, {"model.cache_size_bytes": 2**30}, env={})
    assert plain.hash() == sized_off.hash()  # without a cache its size measures nothing
    assert len({plain.hash(), searched.hash(), bigger.hash()}) == 3
    assert "cache_idx" not in space_for(plain).param_bounds()
    assert space_for(searched).param_bounds()["cache_idx"] == (0, 1)
    with pytest.raises(ScenarioError):
        load_scenario(None, {"space.response_cache": "sometimes"}, env={})


def test_whether_the_report_is_rendered_is_not_in_the_hash() -> None:
    rendered = load_scenario(None, {}, env={})
    summary_only = load_scenario(None, {}, env={"PERFSWEEP_RUN_REPORT": "false"})
    assert rendered.run.report is True and summary_only.run.report is False
    assert rendered.hash() == summary_only.hash()
