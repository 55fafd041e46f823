"""Priority levels and queue policies as a knob: rendering, reading back, choices, validation."""

from __future__ import annotations

import json

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.choices import mix_queue_policy_choices, queue_policy_choices
from analyzer.config.knobs import Knobs, LevelPolicy, QueuePolicyKnob
from analyzer.config.model_config import apply_knobs, knobs_of
from analyzer.errors import InputError
from reference_server.core.config import config_to_text, normalize, parse_config_text, validate

REJECT_25MS = QueuePolicyKnob(2, 2, level_policies=((2, LevelPolicy(25_000, "REJECT")),))


def _config(extra: str = "") -> mc.ModelConfig:
    return text_format.Parse(
        'name: "m" backend: "identity" max_batch_size: 8 '
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }] '
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }] ' + extra,
        mc.ModelConfig(),
    )


def test_the_knob_renders_into_dynamic_batching_and_reads_back() -> None:
    knobs = Knobs(8, 100, queue_policy=REJECT_25MS)
    config = apply_knobs(_config(), knobs)
    batcher = config.dynamic_batching
    assert (batcher.priority_levels, batcher.default_priority_level) == (2, 2)
    assert not batcher.HasField("default_queue_policy")  # Triton's default: left unset
    low = batcher.priority_queue_policy[2]
    assert low.default_timeout_microseconds == 25_000
    assert low.timeout_action == mc.ModelQueuePolicy.REJECT
    assert list(batcher.priority_queue_policy) == [2]
    # The text a user reads in the best config.pbtxt, and what that text parses back to.
    text = config_to_text(config)
    assert "priority_levels: 2" in text and "default_timeout_microseconds: 25000" in text
    assert knobs_of(parse_config_text(text)) == knobs


def test_every_field_round_trips_through_the_config() -> None:
    policy = QueuePolicyKnob(
        priority_levels=3,
        default_priority_level=2,
        default_policy=LevelPolicy(1_000, "DELAY", 16, allow_timeout_override=True),
        level_policies=((1, LevelPolicy()), (3, LevelPolicy(7, "REJECT", 4))),
    )
    knobs = Knobs(4, 0, (4, 2), 2, queue_policy=policy)
    config = apply_knobs(_config(), knobs)
    default = config.dynamic_batching.default_queue_policy
    assert default.timeout_action == mc.ModelQueuePolicy.DELAY
    assert default.allow_timeout_override and default.max_queue_size == 16
    assert knobs_of(config) == knobs


def test_fifo_clears_the_base_config_s_priorities_and_none_keeps_them() -> None:
    base = apply_knobs(_config(), Knobs(8, queue_policy=REJECT_25MS))
    kept = apply_knobs(base, Knobs(8, 200))
    assert kept.dynamic_batching.priority_levels == 2
    assert knobs_of(kept).queue_policy == REJECT_25MS
    cleared = apply_knobs(base, Knobs(8, 200, queue_policy=QueuePolicyKnob()))
    batcher = cleared.dynamic_batching
    assert batcher.priority_levels == 0 and batcher.default_priority_level == 0
    assert not batcher.priority_queue_policy and not batcher.HasField("default_queue_policy")
    # Like the cache's False, the cleared policy reads back as "the model's own" (none).
    assert knobs_of(cleared).queue_policy is None
    assert knobs_of(_config("dynamic_batching {}")).queue_policy is None


def test_dict_and_label_name_the_policy_only_when_set() -> None:
    plain = Knobs(16, 500, (16, 8), 2)
    assert "queue_policy" not in plain.to_dict()
    assert plain.label() == "mbs=16 delay=500us pref=[16,8] x2"
    knobs = Knobs(16, 500, (16, 8), 2, response_cache=True, queue_policy=REJECT_25MS)
    assert knobs.label() == "mbs=16 delay=500us pref=[16,8] x2 cache prio=2/2 p2=reject@25000us"
    assert Knobs(4, queue_policy=QueuePolicyKnob()).label().endswith(" fifo")
    timed = QueuePolicyKnob(default_policy=LevelPolicy(5_000, "DELAY", 64))
    assert timed.label() == "queue=delay@5000us,max64"
    assert knobs.to_dict()["queue_policy"]["priority_queue_policy"]["2"]["timeout_us"] == 25_000
    for k in (plain, knobs, Knobs(4, queue_policy=QueuePolicyKnob()), Knobs(4, queue_policy=timed)):
        # Through JSON, as result files store them.
        assert Knobs.from_dict(json.loads(json.dumps(k.to_dict()))) == k


def test_invalid_policies_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="default_priority_level"):
        QueuePolicyKnob(2, 3)
    with pytest.raises(ValueError, match="level_policies"):
        QueuePolicyKnob(2, 1, level_policies=((3, LevelPolicy()),))
    with pytest.raises(ValueError, match="REJECT or DELAY"):
        LevelPolicy(10, "DROP")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dynamic batching"):
        Knobs(8, dynamic_batching=False, queue_policy=REJECT_25MS)


def test_choices_per_setting() -> None:
    assert queue_policy_choices(None, 2, 50.0) == (None,)
    assert queue_policy_choices("off", 0, 50.0) == (QueuePolicyKnob(),)
    choices = queue_policy_choices("search", 2, 50.0)
    assert choices[0] == QueuePolicyKnob()
    assert choices[1] == QueuePolicyKnob(2, 2)  # priorities alone
    timed = [c for c in choices[2:] if c is not None]
    assert len(timed) == 6
    for knob in timed:
        # The high level never times out; requests without a priority are the low class.
        assert knob.default_priority_level == 2 and knob.policy(1) == LevelPolicy()
    lows = [(c.policy(2).timeout_action, c.policy(2).timeout_us) for c in timed]
    assert lows == [
        ("REJECT", 25_000),
        ("REJECT", 50_000),
        ("REJECT", 100_000),
        ("DELAY", 25_000),
        ("DELAY", 50_000),
        ("DELAY", 100_000),
    ]
    three = queue_policy_choices(
        "search", 3, 10.0, factors=(1.0,), allow_timeout_override=True, max_queue_size=32
    )
    assert three[-1] == QueuePolicyKnob(
        3, 3, level_policies=((3, LevelPolicy(10_000, "DELAY", 32, True)),)
    )


def test_search_refusals_say_what_to_do() -> None:
    with pytest.raises(InputError, match="at least two levels"):
        queue_policy_choices("search", 1, 50.0)
    with pytest.raises(InputError, match="positive p99 goal"):
        queue_policy_choices("search", 2, 0.0)
    with pytest.raises(InputError, match="unknown value"):
        queue_policy_choices("on", 2, 50.0)  # type: ignore[arg-type]
    ordered = _config("dynamic_batching { preserve_ordering: true }")
    with pytest.raises(InputError, match="preserve_ordering") as caught:
        queue_policy_choices("search", 2, 50.0, base=ordered)
    assert "space.queue_policy = 'off'" in str(caught.value)
    assert queue_policy_choices("off", 2, 50.0, base=ordered) == (QueuePolicyKnob(),)


@pytest.mark.parametrize("setting", ["off", "search"])
def test_every_choice_passes_the_reference_server_s_validation(setting: str) -> None:
    choices = queue_policy_choices(setting, 2, 50.0, allow_timeout_override=True)  # type: ignore[arg-type]
    choices += queue_policy_choices("search", 4, 0.2, max_queue_size=8)
    for choice in choices:
        for base in (_config(), _config("dynamic_batching { max_queue_delay_microseconds: 9 }")):
            config = apply_knobs(base, Knobs(8, 100, (8, 4), 2, queue_policy=choice))
            validate(normalize(config))  # raises ModelConfigError with Triton's message


def test_a_priority_mix_gives_the_levels_the_low_goal_and_the_override() -> None:
    from analyzer.config.traffic import TrafficClass

    urgent = TrafficClass(name="urgent", share=0.2, priority=1, p99_ms=50.0)
    rest = TrafficClass(name="rest", share=0.8)  # sends no priority: the default level
    choices = mix_queue_policy_choices("search", (urgent, rest), 500.0)
    assert choices == queue_policy_choices("search", 2, 500.0)
    timed = TrafficClass(name="rest", share=0.8, priority=2, timeout_us=300_000, p99_ms=400.0)
    choices = mix_queue_policy_choices("search", (urgent, timed), 500.0)
    assert choices == queue_policy_choices("search", 2, 400.0, allow_timeout_override=True)
    with pytest.raises(InputError, match="at least two levels"):
        mix_queue_policy_choices("search", (), 500.0)
    assert mix_queue_policy_choices(None, (), 500.0) == (None,)
