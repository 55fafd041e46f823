"""Queue policies as a dimension of the search space (``SearchSpace.policy_choices``)."""

from __future__ import annotations

from pathlib import Path

from analyzer.config.choices import queue_policy_choices
from analyzer.config.knobs import Knobs, QueuePolicyKnob
from analyzer.search.space import SearchSpace
from analyzer.search.study import Search, TrialOutcome


def _space(policies: tuple[QueuePolicyKnob | None, ...] = (None,)) -> SearchSpace:
    return SearchSpace.from_bounds((1, 8), (0, 1000), 2, "none", (1, 2), policy_choices=policies)


def test_the_queue_policy_is_a_dimension_only_when_searched() -> None:
    plain = _space()
    assert "policy_idx" not in plain.param_bounds()
    assert {plain.decode(p).queue_policy for p in plain.points()} == {None}
    choices = queue_policy_choices("search", 2, 50.0)
    searched = _space(choices)
    assert searched.param_bounds()["policy_idx"] == (0, len(choices) - 1)
    assert searched.size() == len(choices) * plain.size()
    decoded = [searched.decode(p) for p in searched.points()]
    assert {k.queue_policy for k in decoded} == set(choices)
    assert len(set(decoded)) == searched.size()  # every point a distinct config
    for knobs in decoded:  # encode is decode's inverse on the grid
        assert searched.decode(searched.encode(knobs)) == knobs
    forced = _space(queue_policy_choices("off", 0, 50.0))
    assert "policy_idx" not in forced.param_bounds()
    assert {forced.decode(p).queue_policy for p in forced.points()} == {QueuePolicyKnob()}


def test_both_choice_dimensions_combine() -> None:
    choices = queue_policy_choices("search", 2, 50.0, factors=(1.0,))
    space = SearchSpace.from_bounds(
        (1, 8), (0, 1000), 2, "none", (1, 1), (False, True), policy_choices=choices
    )
    bounds = space.param_bounds()
    assert bounds["cache_idx"] == (0, 1) and bounds["policy_idx"] == (0, len(choices) - 1)
    pairs = {(k.response_cache, k.queue_policy) for k in map(space.decode, space.points())}
    assert pairs == {(c, p) for c in (False, True) for p in choices}


def test_a_policy_outside_the_choices_encodes_to_the_first() -> None:
    choices = queue_policy_choices("search", 2, 50.0)
    space = _space(choices)
    other = queue_policy_choices("search", 3, 50.0)[-1]
    params = space.encode(Knobs(4, queue_policy=other))
    assert params["policy_idx"] == 0
    assert space.decode(params).queue_policy == choices[0]
    # Seeds decode onto the grid: they carry a choice of the space, never the model's own.
    assert all(k.queue_policy in choices for k in space.seeds(Knobs(8), p99_goal_ms=50.0))


def test_a_study_asks_and_stores_policies(tmp_path: Path) -> None:
    choices = queue_policy_choices("search", 2, 50.0)
    space = _space(choices)
    search = Search(space, ["maximize"], str(tmp_path / "journal.log"), "s", sampler="random")
    wanted = Knobs(8, 1000, instance_count=2, queue_policy=choices[-1])
    search.enqueue(wanted, "planted")
    asked = [search.ask() for _ in range(6)]
    assert asked[0].knobs == wanted
    for trial in asked:
        assert trial.knobs.queue_policy in choices
        search.tell(trial.number, TrialOutcome((1.0,), {"p99": 0.0}))
    assert [f.knobs for f in search.finished()] == [t.knobs for t in asked]
