"""The scenario's priority mix (``[[traffic.classes]]``): validation, round trip, the hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.config.scenario import Scenario, load_scenario
from analyzer.config.traffic import TrafficClass
from analyzer.errors import ScenarioError

MIX = """\
[goals]
p99_ms = 500
[[traffic.classes]]
name = "urgent"
share = 0.2
priority = 1
timeout_us = 100000
p99_ms = 50
[[traffic.classes]]
name = "bulk"
share = 0.8
priority = 2
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


def test_a_mix_reads_with_its_defaults_and_its_class_goals(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, MIX), env={})
    assert s.traffic.classes == (
        TrafficClass(name="urgent", share=0.2, priority=1, timeout_us=100000, p99_ms=50.0),
        TrafficClass(name="bulk", share=0.8, priority=2),
    )
    bulk = s.traffic.classes[1]
    assert (bulk.timeout_us, bulk.p99_ms) == (0, 0.0)  # none sent; the run's goal
    assert s.traffic.class_goals() == (("urgent", 50.0),)


def test_a_mix_round_trips_through_toml_and_is_in_the_hash(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, MIX), env={})
    again = load_scenario(write(tmp_path, s.to_toml()), env={})
    assert again == s
    assert again.hash() == s.hash()
    plain = load_scenario(write(tmp_path, "[goals]\np99_ms = 500\n"), env={})
    assert s.hash() != plain.hash()
    other = load_scenario(write(tmp_path, MIX.replace("priority = 2", "priority = 3")), env={})
    assert other.hash() != s.hash()


def test_no_mix_keeps_the_dump_and_the_hash_of_older_scenarios() -> None:
    default = Scenario()
    assert "classes" not in default.to_dict()["traffic"]
    assert "classes" not in default.to_toml()
    explicit = load_scenario(None, {"traffic.classes": []}, env={})
    assert explicit.hash() == default.hash()
    assert explicit.to_dict() == default.to_dict()


@pytest.mark.parametrize(
    ("classes", "needle"),
    [
        (
            [{"name": "a", "share": 0.5}, {"name": "b", "share": 0.4}],
            "traffic.classes: the shares must sum to 1, got 0.5 + 0.4 = 0.9",
        ),
        (
            [{"name": "a", "share": 0.5}, {"name": "a", "share": 0.5}],
            "class name 'a' is used twice",
        ),
        ([{"name": "a", "share": 0}], "a share of the load or a rate of its own"),
        ([{"name": "a", "share": 1, "priority": -1}], "traffic.classes.priority"),
        ([{"name": "a", "share": 1, "timeout_us": -5}], "traffic.classes.timeout_us"),
        ([{"name": "a", "share": 1, "p99_ms": -1}], "traffic.classes.p99_ms"),
        ([{"name": "a b", "share": 1}], "traffic.classes.name"),
        ([{"share": 1}], "traffic.classes.name"),
        ([{"name": "a", "share": 1, "priorty": 1}], "unknown key 'traffic.classes.priorty'"),
    ],
)
def test_a_bad_mix_is_a_one_line_error(classes: list[dict], needle: str) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(None, {"traffic.classes": classes}, env={})
    message = str(info.value)
    assert needle in message
    assert "\n" not in message
