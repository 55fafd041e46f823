"""The predict simulator refuses priority levels and queue policies instead of ignoring them."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.choices import queue_policy_choices
from analyzer.config.knobs import Knobs, QueuePolicyKnob
from analyzer.config.model_config import apply_knobs
from analyzer.errors import InputError
from analyzer.predict.capacity import capacities, latency_offset
from analyzer.predict.profile import BatchTiming, Profile
from analyzer.predict.sim_records import SimConfig
from analyzer.predict.simulator import simulate
from analyzer.search.space import SearchSpace
from analyzer.search.strategy import Guide, grid_configs

POLICY = queue_policy_choices("search", 2, 50.0)[2]  # the low level REJECTs after 25 ms


def _profile(largest: int = 8) -> Profile:
    return Profile(
        model="planted",
        provenance="planted test profile",
        source="test",
        timings=tuple(BatchTiming(b, 0.0, 1.0 + 0.1 * b, 0.0) for b in range(1, largest + 1)),
    )


def _config(extra: str = "") -> mc.ModelConfig:
    return text_format.Parse(
        'name: "m" backend: "identity" max_batch_size: 8 ' + extra, mc.ModelConfig()
    )


def test_sim_configs_know_when_a_policy_is_set() -> None:
    assert SimConfig.from_knobs(Knobs(8, 100, queue_policy=POLICY)).queue_policy
    assert not SimConfig.from_knobs(Knobs(8, 100)).queue_policy
    assert not SimConfig.from_knobs(Knobs(8, 100, queue_policy=QueuePolicyKnob())).queue_policy
    with_policy = apply_knobs(_config("dynamic_batching {}"), Knobs(8, queue_policy=POLICY))
    assert SimConfig.from_model_config(with_policy).queue_policy
    assert not SimConfig.from_model_config(_config("dynamic_batching {}")).queue_policy
    # Triton's defaults written out are no policy; a bound alone is one.
    written = "dynamic_batching { default_queue_policy { timeout_action: REJECT } }"
    assert not SimConfig.from_model_config(_config(written)).queue_policy
    bounded = "dynamic_batching { default_queue_policy { max_queue_size: 4 } }"
    assert SimConfig.from_model_config(_config(bounded)).queue_policy


def test_the_simulator_refuses_a_policy_it_does_not_model() -> None:
    config = SimConfig.from_knobs(Knobs(8, 100, queue_policy=POLICY))
    with pytest.raises(InputError, match="not priority levels or queue policies") as caught:
        simulate(_profile(), config, 100.0, requests=200)
    assert "measure this config instead" in str(caught.value)
    plain = SimConfig.from_knobs(Knobs(8, 100))
    with pytest.raises(InputError, match="queue policies"):
        capacities(_profile(), [plain, config], 50.0, requests=200)
    # A policy's measured operating point does not calibrate the FIFO offset.
    assert latency_offset(_profile(), [(config, 100.0, 40.0)], requests=200) is None
    assert latency_offset(_profile(), [(plain, 100.0, 40.0)], requests=200) is not None


@pytest.mark.usefixtures("takes_seconds")
def test_predict_leaves_policy_configs_uncovered() -> None:
    choices = queue_policy_choices("search", 2, 50.0, factors=(1.0,))
    space = SearchSpace.from_bounds((1, 8), (0, 1000), 2, "none", (1, 1), policy_choices=choices)
    configs = grid_configs(space)
    guide = Guide.predict(_profile(), configs, goal_p99_ms=50.0, half_width=0.1)
    fifo = [k for k in configs if k.queue_policy == QueuePolicyKnob()]
    assert set(guide.predictions) == set(fifo)
    assert set(guide.uncovered) == set(configs) - set(fifo)
    best = guide.best()
    assert best is not None and best[0].queue_policy == QueuePolicyKnob()
    assert all(k.queue_policy == QueuePolicyKnob() for k in guide.ranked())
    assert guide.forecast(Knobs(8, 100, queue_policy=POLICY)) is None
