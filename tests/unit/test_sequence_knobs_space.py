"""The oldest strategy's candidate sequences as a dimension of the search space
(``SearchSpace.candidate_choices``, ``cand_idx``)."""

from __future__ import annotations

from pathlib import Path

from analyzer.config.choices import candidate_choices
from analyzer.config.knobs import Knobs
from analyzer.config.model_config import apply_knobs, knobs_of
from analyzer.search.space import SearchSpace
from analyzer.search.study import Search, TrialOutcome
from reference_server.core.config import normalize, validate
from reference_server.zoo.accumulator import accumulator_config


def _space(candidates: tuple[int | None, ...] = (None,)) -> SearchSpace:
    return SearchSpace.from_bounds(
        (1, 8), (0, 1000), 3, "auto", (1, 2), candidate_choices=candidates
    )


def test_candidates_are_a_dimension_only_with_two_or_more_choices() -> None:
    plain = _space()
    assert "cand_idx" not in plain.param_bounds()
    assert {plain.decode(p).max_candidate_sequences for p in plain.points()} == {None}
    one = _space((6,))
    assert "cand_idx" not in one.param_bounds()
    assert {one.decode(p).max_candidate_sequences for p in one.points()} == {6}
    choices = candidate_choices((4, 8, 16))
    searched = _space(choices)
    assert searched.param_bounds()["cand_idx"] == (0, 2)
    assert searched.size() == 3 * plain.size()
    decoded = [searched.decode(p) for p in searched.points()]
    assert {k.max_candidate_sequences for k in decoded} == {4, 8, 16}
    for knobs in decoded:  # encode is decode's inverse on the grid
        assert searched.decode(searched.encode(knobs)) == knobs


def test_a_count_off_the_grid_encodes_to_the_nearest_choice() -> None:
    space = _space((4, 8, 16))
    assert space.encode(Knobs(8, max_candidate_sequences=7))["cand_idx"] == 1
    assert space.encode(Knobs(8, max_candidate_sequences=100))["cand_idx"] == 2
    assert space.encode(Knobs(8))["cand_idx"] == 0  # the model's own: the first choice
    assert all(
        k.max_candidate_sequences in (4, 8, 16) for k in space.seeds(Knobs(8), p99_goal_ms=20.0)
    )


def test_every_point_of_a_sequence_space_is_a_valid_oldest_config() -> None:
    base = accumulator_config("acc", max_batch_size=8)
    space = _space(candidate_choices((2, 8), base))
    for params in space.points():
        knobs = space.decode(params)
        config = normalize(apply_knobs(base, knobs))
        validate(config)
        assert not config.HasField("dynamic_batching")
        assert knobs_of(config) == knobs


def test_a_study_asks_and_stores_candidates(tmp_path: Path) -> None:
    space = _space((4, 8, 16))
    search = Search(space, ["maximize"], str(tmp_path / "journal.log"), "s", sampler="random")
    wanted = Knobs(8, 1000, instance_count=2, max_candidate_sequences=16)
    search.enqueue(wanted, "planted")
    asked = [search.ask() for _ in range(5)]
    assert asked[0].knobs == wanted
    for trial in asked:
        assert trial.knobs.max_candidate_sequences in (4, 8, 16)
        search.tell(trial.number, TrialOutcome((1.0,), {"p99": 0.0}))
    assert [f.knobs for f in search.finished()] == [t.knobs for t in asked]
