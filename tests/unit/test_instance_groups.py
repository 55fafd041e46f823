"""Instance groups as Triton means them: counted per listed GPU, every group kept, one count
searched per group (analyzer.config.knobs, analyzer.search.study, analyzer.search.strategy's coverage)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import Knobs
from analyzer.config.model_config import apply_knobs, group_devices, instances_of, knobs_of
from analyzer.predict.profile import BatchTiming, Profile
from analyzer.predict.sim_records import SimConfig
from analyzer.search.space import SearchSpace
from analyzer.search.strategy import Guide, grid_configs
from analyzer.search.study import Search, TrialOutcome
from reference_server.core.config import normalize, validate

GPUS = (0, 1)

TWO_GROUPS = """
name: "m" backend: "identity" max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [
  { name: "fast" kind: KIND_GPU count: 2 gpus: [0, 1]
    rate_limiter { priority: 2 resources [ { name: "R" count: 1 } ] } },
  { name: "spill" kind: KIND_CPU count: 1 }
]
"""


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def _group(text: str) -> mc.ModelInstanceGroup:
    return text_format.Parse(text, mc.ModelInstanceGroup())


def _one_group(group: str) -> mc.ModelConfig:
    return _config(
        f'name: "m" backend: "identity" max_batch_size: 8 instance_group [ {{ {group} }} ]'
    )


def _valid(config: mc.ModelConfig) -> mc.ModelConfig:
    normalized = normalize(config, gpu_ids=GPUS)
    validate(normalized, gpu_ids=GPUS)
    return normalized


def _space(base: mc.ModelConfig | None, instances: tuple[int, int] = (1, 3)) -> SearchSpace:
    return SearchSpace.from_bounds((1, 8), (0, 1000), 2, "auto", instances, base=base)


# -- counting ---------------------------------------------------------------------------------


def test_a_gpu_group_runs_its_count_on_each_listed_gpu() -> None:
    assert instances_of(_group("kind: KIND_GPU count: 2 gpus: [0, 1]")) == 4
    assert instances_of(_group("kind: KIND_GPU count: 3 gpus: [1]")) == 3
    assert instances_of(_group("kind: KIND_CPU count: 3")) == 3
    assert instances_of(_group("kind: KIND_GPU count: 2")) == 2  # no list: the config can't say
    assert instances_of(_group("kind: KIND_GPU gpus: [0, 1]")) == 2  # count 0: Triton's 1
    assert instances_of(_group("kind: KIND_CPU")) == 1


def test_knobs_of_counts_as_triton_and_reads_each_group() -> None:
    knobs = knobs_of(_config(TWO_GROUPS))
    assert knobs.instance_count == 5  # 2 on each of two GPUs, and 1 on the CPU
    assert knobs.group_counts == (2, 1)
    on_two_gpus = knobs_of(_one_group("kind: KIND_GPU count: 2 gpus: [0, 1]"))
    assert (on_two_gpus.instance_count, on_two_gpus.group_counts) == (4, (2,))
    # One group on one device reads as before groups were searched.
    plain = knobs_of(_one_group("kind: KIND_CPU count: 3"))
    assert (plain.instance_count, plain.group_counts) == (3, None)
    assert knobs_of(_config('name: "m" backend: "identity"')).group_counts is None


def test_the_simulator_counts_as_triton() -> None:
    assert SimConfig.from_model_config(_config(TWO_GROUPS)).instance_count == 5
    assert SimConfig.from_model_config(_one_group("kind: KIND_CPU count: 3")).instance_count == 3


# -- knobs ------------------------------------------------------------------------------------


def test_group_counts_round_trip_and_appear_only_when_set() -> None:
    plain = Knobs(8, 100, (8, 4), 2)
    assert "group_counts" not in plain.to_dict()
    assert Knobs.from_dict(plain.to_dict()) == plain
    assert plain.label() == "mbs=8 delay=100us pref=[8,4] x2"
    grouped = Knobs(8, 100, (8, 4), 5, group_counts=(2, 1))
    assert grouped.to_dict()["group_counts"] == [2, 1]
    assert grouped.to_dict()["instance_count"] == 5
    assert Knobs.from_dict(grouped.to_dict()) == grouped
    assert grouped.label() == "mbs=8 delay=100us pref=[8,4] x5 groups=[2,1]"
    unbatched = Knobs(8, instance_count=5, dynamic_batching=False, group_counts=(2, 1))
    assert unbatched.label() == "mbs=8 no dynamic batching x5 groups=[2,1]"


@pytest.mark.parametrize("counts", [(), (0,), (2, -1)])
def test_group_counts_need_a_positive_count_per_group(counts: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="group_counts"):
        Knobs(8, group_counts=counts)


def test_apply_keeps_every_group_and_sets_each_count() -> None:
    base = _config(TWO_GROUPS)
    knobs = Knobs(8, 200, (8, 4), 3 * 2 + 2, group_counts=(3, 2))
    config = apply_knobs(base, knobs)
    fast, spill = config.instance_group
    assert (fast.name, fast.kind, list(fast.gpus), fast.count) == (
        "fast",
        mc.ModelInstanceGroup.KIND_GPU,
        [0, 1],
        3,
    )
    assert fast.rate_limiter == base.instance_group[0].rate_limiter
    assert (spill.name, spill.kind, list(spill.gpus), spill.count) == (
        "spill",
        mc.ModelInstanceGroup.KIND_CPU,
        [],
        2,
    )
    assert knobs_of(_valid(config)) == knobs


def test_apply_refuses_counts_that_do_not_fit_the_base() -> None:
    base = _config(TWO_GROUPS)
    with pytest.raises(ValueError, match="name 1 instance groups; model 'm' has 2"):
        apply_knobs(base, Knobs(8, instance_count=2, group_counts=(2,)))
    with pytest.raises(ValueError, match=r"make 5 instances .* not instance_count 3"):
        apply_knobs(base, Knobs(8, instance_count=3, group_counts=(2, 1)))


def test_knobs_without_group_counts_keep_todays_first_group() -> None:
    config = apply_knobs(_config(TWO_GROUPS), Knobs(8, 100, (), 3))
    assert [(g.name, g.count) for g in config.instance_group] == [("fast", 3)]


# -- the space ----------------------------------------------------------------------------------


def test_a_one_group_base_is_todays_space() -> None:
    today = _space(None)
    for base in (_one_group("kind: KIND_CPU count: 2"), _config('name: "m" backend: "x"')):
        space = _space(base)
        assert space.param_bounds() == today.param_bounds()
        assert "instances" in space.param_bounds()
        assert [space.decode(p) for p in space.points()] == [
            today.decode(p) for p in today.points()
        ]
        assert space.seeds(knobs_of(base), 40.0) == today.seeds(knobs_of(base), 40.0)


def test_a_two_group_base_gives_one_dimension_per_group() -> None:
    base = _config(TWO_GROUPS)
    space = _space(base, (1, 3))
    bounds = space.param_bounds()
    assert "instances" not in bounds
    assert (bounds["instances_0"], bounds["instances_1"]) == ((1, 3), (1, 3))
    assert space.size() == 9 * _space(None, (1, 1)).size()
    decoded = [space.decode(p) for p in space.points()]
    assert {k.group_counts for k in decoded} == {(a, b) for a in (1, 2, 3) for b in (1, 2, 3)}
    for knobs in decoded:
        assert knobs.group_counts is not None
        assert knobs.instance_count == 2 * knobs.group_counts[0] + knobs.group_counts[1]
        assert space.decode(space.encode(knobs)) == knobs  # encode is decode's inverse
        assert knobs_of(_valid(apply_knobs(base, knobs))) == knobs
    # The model's own config is a seed, and the seeds span every group's bounds.
    seeds = space.seeds(knobs_of(base), 40.0)
    assert seeds[0].group_counts == (2, 1)
    assert {s.group_counts for s in seeds} >= {(2, 1), (1, 1), (3, 3)}


def test_counts_off_the_bounds_encode_to_the_nearest() -> None:
    space = _space(_config(TWO_GROUPS), (1, 3))
    params = space.encode(Knobs(8, instance_count=9, group_counts=(4, 1)))
    assert (params["instances_0"], params["instances_1"]) == (3, 1)
    # Knobs without counts for these groups give each group their count.
    params = space.encode(Knobs(8, instance_count=2))
    assert (params["instances_0"], params["instances_1"]) == (2, 2)


def test_one_group_on_two_gpus_keeps_the_one_dimension_and_counts_per_gpu() -> None:
    base = _one_group("kind: KIND_GPU count: 1 gpus: [0, 1]")
    assert group_devices(base) == (2,)
    space = _space(base)
    assert space.param_bounds() == _space(None).param_bounds()
    knobs = space.decode({"log2_mbs": 3, "instances": 3})
    assert (knobs.instance_count, knobs.group_counts) == (6, (3,))
    assert [g.count for g in apply_knobs(base, knobs).instance_group] == [3]


def test_a_study_of_a_one_group_base_resumes_as_before(tmp_path: Path) -> None:
    storage = str(tmp_path / "study.journal")
    before = Search(_space(None), ["maximize"], storage, "s", sampler="random")
    asked = before.ask()
    before.tell(asked.number, TrialOutcome((1.0,), {"p99": -1.0}))
    after = Search(_space(_one_group("kind: KIND_CPU count: 1")), ["maximize"], storage, "s")
    assert [f.knobs for f in after.finished()] == [asked.knobs]
    assert after.ask().knobs.group_counts is None


# -- predict ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("spawns")
def test_predict_leaves_configs_over_several_groups_or_gpus_uncovered() -> None:
    profile = Profile(
        model="planted",
        provenance="planted test profile",
        source="test",
        timings=tuple(BatchTiming(b, 0.0, 1.0 + 0.1 * b, 0.0) for b in range(1, 9)),
    )
    grouped = grid_configs(_space(_config(TWO_GROUPS), (1, 2)))
    on_two_gpus = grid_configs(_space(_one_group("kind: KIND_GPU count: 1 gpus: [0, 1]")))
    plain = grid_configs(_space(_one_group("kind: KIND_GPU count: 1 gpus: [0]")))
    guide = Guide.predict(profile, [*grouped, *on_two_gpus, *plain], 50.0, 0.1)
    assert set(guide.predictions) == set(plain)
    assert set(guide.uncovered) == {*grouped, *on_two_gpus}
    assert guide.forecast(grouped[0]) is None
