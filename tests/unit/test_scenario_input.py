"""The scenario's ``[input]``: shapes, a data file (beside the scenario, by its sha256), the
random rotation's knobs and a shape distribution, each checked with a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.config.scenario import input_overrides, load_scenario
from analyzer.config.sections import data_digest
from analyzer.errors import ScenarioError
from analyzer.load.engine import engine_options
from analyzer.load.inputs import DataMode, ShapeChoice


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def data_json(path: Path, values: list[float]) -> Path:
    return write(path, json.dumps({"data": [{"X": {"content": values, "shape": [3, 4]}}]}))


def test_every_input_key_reads_from_a_file_and_round_trips(tmp_path: Path) -> None:
    path = write(
        tmp_path / "s.toml",
        """
[input]
batch_size = 4
shapes = {IDS = [128], MASK = [128]}
unique_payloads = 500
repeat_ratio = 0.25
distribution = [
  {shapes = {IDS = [16], MASK = [16]}, weight = 3},
  {shapes = {IDS = [512], MASK = [512]}},
]
""",
    )
    s = load_scenario(path, env={})
    assert s.input.shapes == {"IDS": (128,), "MASK": (128,)}
    assert [(d.shapes["IDS"], d.weight) for d in s.input.distribution] == [((16,), 3), ((512,), 1)]
    assert s.input.mode == "random"
    again = load_scenario(write(tmp_path / "again.toml", s.to_toml()), env={})
    assert again == s and again.hash() == s.hash()
    options = engine_options(s, "127.0.0.1:8000", "m")
    inputs = options.inputs
    assert (inputs.mode, inputs.batch_size, inputs.shapes) == (
        DataMode.RANDOM,
        4,
        {"IDS": [128], "MASK": [128]},
    )
    assert (inputs.unique_payloads, inputs.repeat_ratio) == (500, 0.25)
    assert inputs.distribution[0] == ShapeChoice.of({"IDS": [16], "MASK": [16]}, 3.0)


def test_a_data_file_is_found_beside_the_scenario_and_recorded_by_sha256(tmp_path: Path) -> None:
    data = data_json(tmp_path / "cfg" / "data.json", [1.0] * 12)
    s = load_scenario(
        write(tmp_path / "cfg" / "s.toml", '[input]\ndata_file = "data.json"\n'), env={}
    )
    assert s.input.data_file == data.resolve()
    assert s.input.data_sha256 == data_digest(data)
    assert s.input.mode == "file"
    options = engine_options(s, "h:1", "m")
    assert (options.inputs.mode, options.inputs.data_file) == (DataMode.FILE, data.resolve())
    # The bytes count, not the place: the same file elsewhere measures the same thing.
    moved = data_json(tmp_path / "elsewhere" / "data.json", [1.0] * 12)
    other = load_scenario(None, {"input.data_file": str(moved)}, env={})
    assert other.hash() == s.hash()
    changed = data_json(tmp_path / "changed" / "data.json", [2.0] * 12)
    assert load_scenario(None, {"input.data_file": str(changed)}, env={}).hash() != s.hash()


def test_a_recorded_scenario_whose_data_file_changed_is_refused(tmp_path: Path) -> None:
    data = data_json(tmp_path / "data.json", [1.0] * 12)
    s = load_scenario(None, {"input.data_file": str(data)}, env={})
    saved = write(tmp_path / "run" / "scenario.toml", s.to_toml())
    assert load_scenario(saved, env={}) == s  # unchanged: resumable
    data_json(data, [1.0] * 11 + [9.0])
    with pytest.raises(ScenarioError, match="changed since this scenario was recorded"):
        load_scenario(saved, env={})


def test_a_directory_digest_covers_names_and_bytes(tmp_path: Path) -> None:
    write(tmp_path / "d" / "X", "abc")
    first = data_digest(tmp_path / "d")
    (tmp_path / "d" / "X").rename(tmp_path / "d" / "Y")
    assert data_digest(tmp_path / "d") != first


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"input.data_file": "/no/such/data.json"}, "no such file or directory"),
        ({"input.repeat_ratio": 1.0}, "input.repeat_ratio: repeat ratio must be in [0, 1)"),
        ({"input.unique_payloads": 0}, "input.unique_payloads: unique payloads must be >= 1"),
        ({"input.shapes": {"IDS": [-1]}}, "input.shapes"),
        ({"input.distribution": [{"shapes": {}}]}, "needs shapes"),
        ({"input.distribution": [{"shapes": {"IDS": [4]}, "weight": 0}]}, "weight"),
        ({"input.data": "zeros", "input.repeat_ratio": 0.5}, "apply to random data, not zeros"),
        ({"input.data_sha256": "ab"}, "needs input.data_file"),
        ({"input.batch_size": 0}, "input.batch_size"),
    ],
)
def test_bad_input_sections_are_one_line_errors(overrides: dict, needle: str) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(None, overrides, env={})
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_random_only_knobs_are_refused_with_a_data_file(tmp_path: Path) -> None:
    data = data_json(tmp_path / "data.json", [1.0] * 12)
    with pytest.raises(
        ScenarioError,
        match="unique_payloads: unique payloads, repeat ratio and distribution apply to random data, not a data_file",
    ):
        load_scenario(None, {"input.data_file": str(data), "input.unique_payloads": 5}, env={})


def test_the_shared_memory_flag_reaches_the_generator_fields() -> None:
    from analyzer.load.engine import input_fields

    flags = input_overrides(shared_memory="system")
    assert flags["input.shared_memory"] == "system"
    scenario = load_scenario(None, flags, env={})
    assert input_fields(scenario.input)["shared_memory"] == "system"
    assert input_fields(load_scenario(None, {}, env={}).input)["shared_memory"] == "none"
