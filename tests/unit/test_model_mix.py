"""A mix of models, the pure parts: ``--mix`` as traffic classes, each class's model, and the
client that sends each request to its class's model."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.config.scenario import load_scenario, mix_overrides
from analyzer.errors import InputError
from analyzer.load.classes import (
    RequestClass,
    RoutedClient,
    class_models,
    level_classes,
    mix_models,
    request_classes,
)
from analyzer.load.sequences import SequenceStep


def test_the_quick_form_is_one_class_per_model_with_its_share() -> None:
    scenario = load_scenario(None, mix_overrides("a=3, b=1"), env={})
    classes = request_classes(scenario.traffic)
    assert [(c.name, c.model, c.share) for c in classes] == [("a", "a", 0.75), ("b", "b", 0.25)]
    assert mix_overrides(None) == {}


def test_a_model_of_the_quick_form_can_have_its_own_p99_goal() -> None:
    scenario = load_scenario(
        None, {"goals.p99_ms": 100.0, **mix_overrides("a=3@100,b=1@40")}, env={}
    )
    assert [(c.model, c.p99_ms) for c in scenario.traffic.classes] == [("a", 100.0), ("b", 40.0)]
    assert scenario.traffic.class_goals() == (("a", 100.0), ("b", 40.0))
    # Without @ a model is held to the run's goal, as before.
    assert load_scenario(None, mix_overrides("a=3,b=1@40"), env={}).traffic.class_goals() == (
        ("b", 40.0),
    )


@pytest.mark.parametrize(
    "text",
    ["a", "a=3", "a=0,b=1", "a=1,a=2", "a=x,b=1", "=1,b=1", "a=1@0,b=1", "a=1@x,b=1", "a=1@,b=1"],
)
def test_a_mix_that_names_no_two_weighted_models_is_refused(text: str) -> None:
    with pytest.raises(InputError, match="--mix"):
        mix_overrides(text)


def test_a_class_without_a_model_dumps_as_before() -> None:
    plain = {"traffic.classes": [{"name": "urgent", "share": 0.5}, {"name": "bulk", "share": 0.5}]}
    scenario = load_scenario(None, plain, env={})
    assert all("model" not in c for c in scenario.to_dict()["traffic"]["classes"])
    mixed = load_scenario(None, mix_overrides("a=1,b=1"), env={})
    assert [c["model"] for c in mixed.to_dict()["traffic"]["classes"]] == ["a", "b"]
    assert mixed.hash() != scenario.hash()


def test_the_load_model_comes_first_and_unnamed_classes_are_its_own() -> None:
    classes = (RequestClass("x", 0.5, model="b"), RequestClass("y", 0.5))
    assert mix_models(classes, "a") == ("a", "b")
    assert class_models(classes, "a") == ("b", "a")
    assert mix_models((), "a") == ("a",) and class_models((), "a") == ("a",)


class _Recording:
    def __init__(self) -> None:
        self.sent: list[tuple[int, int]] = []
        self.closed = False

    def infer(
        self, payload_index: int, klass: int = 0, sequence: SequenceStep | None = None
    ) -> None:
        self.sent.append((payload_index, klass))

    def close(self) -> None:
        self.closed = True


def test_the_routed_client_sends_each_class_to_its_models_client() -> None:
    a, b = _Recording(), _Recording()
    routed = RoutedClient([b, a, b], [a, b])
    for klass in (0, 1, 2, 1):
        routed.infer(7, klass)
    assert a.sent == [(7, 1), (7, 1)] and b.sent == [(7, 0), (7, 2)]
    routed.close()
    assert a.closed and b.closed


MODELS_TOML = """
[goals]
p99_ms = 100

[[models]]
name = "detector"
share = 3
p99_ms = 40

[[models]]
name = "classifier"
share = 1
"""


def test_models_entries_are_a_class_per_model_with_its_goal(tmp_path: Path) -> None:
    path = tmp_path / "mix.toml"
    path.write_text(MODELS_TOML)
    scenario = load_scenario(path, {}, env={})
    assert scenario.model.name == "detector"
    assert scenario.mix() == ("detector", "classifier")
    assert [(c.name, c.model, c.share, c.p99_ms) for c in scenario.traffic.classes] == [
        ("detector", "detector", 0.75, 40.0),
        ("classifier", "classifier", 0.25, 0.0),
    ]
    assert scenario.tightest_p99_ms() == 40.0
    # The dump is the classes it became, and reads back equal.
    again = tmp_path / "again.toml"
    again.write_text(scenario.to_toml())
    assert load_scenario(again, {}, env={}) == scenario
    assert load_scenario(None, {}, env={}).mix() == ()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[[traffic.classes]]\nname = "x"\nshare = 1.0\n', "both given"),
        ('[[models]]\nname = "third"\nshare = 0\n', "positive"),
        ('[[models]]\nname = "third"\nrate = 5\n', "unknown key"),
        ('[[models]]\nname = "third"\nshare = 1\nrate_rps = 5\n', "not both"),
    ],
)
def test_a_bad_models_list_is_refused(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(MODELS_TOML + extra)
    with pytest.raises(InputError, match=message):
        load_scenario(path, {}, env={})


def test_a_load_model_outside_the_mix_is_refused() -> None:
    with pytest.raises(InputError, match="gets none of the mix's requests"):
        load_scenario(None, {"model.name": "c", **mix_overrides("a=1,b=1")}, env={})


def test_a_model_can_hold_a_rate_of_its_own_in_the_quick_form() -> None:
    scenario = load_scenario(None, mix_overrides("a=3,b=1@40,c=20/s@30"), env={})
    assert [(c.model, c.share, c.rate_rps, c.p99_ms) for c in scenario.traffic.classes] == [
        ("a", 0.75, 0.0, 0.0),
        ("b", 0.25, 0.0, 40.0),
        ("c", 0.0, 20.0, 30.0),
    ]
    # The lowest rate a capacity search tries leaves the shared models some of the load.
    assert scenario.traffic.min_rate_rps == pytest.approx(21.0)
    assert scenario.traffic.fixed_rps() == 20.0
    assert scenario.mix_shares_goals()[2] == ("c", 0.0, 30.0, 20.0)


@pytest.mark.parametrize("text", ["a=1/s,b=2/s", "a=1,b=0/s", "a=1,b=x/s", "a=1,b=/s"])
def test_a_quick_form_with_no_shared_model_or_a_bad_rate_is_refused(text: str) -> None:
    with pytest.raises(InputError, match="--mix"):
        mix_overrides(text)


def test_models_entries_can_hold_a_rate_of_their_own(tmp_path: Path) -> None:
    path = tmp_path / "mix.toml"
    path.write_text(MODELS_TOML + '[[models]]\nname = "ranker"\nrate_rps = 50\np99_ms = 80\n')
    scenario = load_scenario(path, {}, env={})
    assert [(c.model, c.share, c.rate_rps) for c in scenario.traffic.classes] == [
        ("detector", 0.75, 0.0),
        ("classifier", 0.25, 0.0),
        ("ranker", 0.0, 50.0),
    ]
    assert scenario.traffic.min_rate_rps == pytest.approx(52.5)
    again = tmp_path / "again.toml"
    again.write_text(scenario.to_toml())
    assert load_scenario(again, {}, env={}) == scenario


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"traffic.min_rate_rps": 10.0}, "must be above the classes' own rates"),
        ({"traffic.mode": "concurrency"}, "needs open-loop load"),
    ],
)
def test_a_rate_of_its_own_needs_open_loop_rates_above_it(overrides: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        load_scenario(None, {**mix_overrides("a=1,b=20/s"), **overrides}, env={})


def test_a_class_has_a_share_or_a_rate_not_both_nor_neither() -> None:
    both = {"traffic.classes": [{"name": "x", "share": 1.0, "rate_rps": 5.0}]}
    with pytest.raises(InputError, match="one of them"):
        load_scenario(None, both, env={})
    neither = {"traffic.classes": [{"name": "x"}, {"name": "y", "share": 1.0}]}
    with pytest.raises(InputError, match="one of them"):
        load_scenario(None, neither, env={})


def test_at_each_level_the_shared_models_divide_what_the_held_rates_leave() -> None:
    classes = (
        RequestClass("a", 0.75, model="a"),
        RequestClass("b", 0.25, model="b"),
        RequestClass("c", 0.0, model="c", rate_rps=20.0),
    )
    at_100 = level_classes(classes, 100.0)
    assert [round(c.share * 100.0, 6) for c in at_100] == [60.0, 20.0, 20.0]
    at_420 = level_classes(classes, 420.0)
    assert [round(c.share * 420.0, 6) for c in at_420] == [300.0, 100.0, 20.0]
    plain = (RequestClass("a", 0.5), RequestClass("b", 0.5))
    assert level_classes(plain, 100.0) == plain
    with pytest.raises(InputError, match="leaves nothing"):
        level_classes(classes, 20.0)
