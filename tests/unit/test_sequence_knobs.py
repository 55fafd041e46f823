"""The knobs of a stateful model: written into ``sequence_batching.oldest``, read back, refused
where Triton has no place for them (analyzer.config.knobs)."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.choices import candidate_choices, queue_policy_choices, response_cache_choices
from analyzer.config.knobs import Knobs, QueuePolicyKnob
from analyzer.config.model_config import apply_knobs, knobs_of
from analyzer.errors import InputError
from reference_server.core.config import normalize, validate
from reference_server.zoo.accumulator import accumulator_config


def _oldest(**kw: object) -> mc.ModelConfig:
    return accumulator_config("acc", **kw)  # type: ignore[arg-type]


def _valid(config: mc.ModelConfig) -> mc.ModelConfig:
    normalized = normalize(config)
    validate(normalized)
    return normalized


def test_the_knobs_go_into_oldest_and_dynamic_batching_is_never_set() -> None:
    knobs = Knobs(16, 2000, (16, 8), 2, max_candidate_sequences=12)
    config = apply_knobs(_oldest(), knobs)
    assert config.WhichOneof("scheduling_choice") == "sequence_batching"
    assert not config.HasField("dynamic_batching")
    oldest = config.sequence_batching.oldest
    assert config.max_batch_size == 16
    assert oldest.max_queue_delay_microseconds == 2000
    assert list(oldest.preferred_batch_size) == [16, 8]
    assert oldest.max_candidate_sequences == 12
    assert [g.count for g in config.instance_group] == [2]
    # The controls the model reads are kept.
    assert [c.name for c in config.sequence_batching.control_input] == [
        "START",
        "END",
        "READY",
        "CORRID",
    ]
    assert knobs_of(_valid(config)) == knobs


def test_unset_candidates_keep_the_model_own() -> None:
    base = _oldest(max_candidate_sequences=5, max_queue_delay_us=100)
    config = apply_knobs(base, Knobs(8, 300))
    assert config.sequence_batching.oldest.max_candidate_sequences == 5
    assert config.sequence_batching.oldest.max_queue_delay_microseconds == 300
    assert not config.sequence_batching.oldest.preferred_batch_size


def test_knobs_of_an_oldest_config() -> None:
    base = _oldest(max_batch_size=8, max_queue_delay_us=700, preferred=(4,))
    assert knobs_of(base) == Knobs(8, 700, (4,), 1)
    # Triton normalises no preferred sizes to [max_batch_size]: that reads as none, as for
    # dynamic_batching; 0 candidates (one per batch slot) reads as the model's own.
    assert knobs_of(_valid(_oldest(max_batch_size=8))) == Knobs(8, 0, (), 1)
    assert knobs_of(_oldest(max_candidate_sequences=3)).max_candidate_sequences == 3


@pytest.mark.parametrize(
    "knobs",
    [
        Knobs(1, 0),
        Knobs(8, 0, (8, 4), 1),
        Knobs(32, 10_000, (32, 16, 8), 4, max_candidate_sequences=64),
        Knobs(4, 50, (), 3, max_candidate_sequences=1),
        Knobs(8, 0, response_cache=False),
    ],
)
def test_every_written_config_passes_the_reference_validation(knobs: Knobs) -> None:
    config = _valid(apply_knobs(_oldest(preferred=(8,)), knobs))
    assert not config.HasField("dynamic_batching")
    assert config.sequence_batching.HasField("oldest")


def test_to_dict_and_label_mention_candidates_only_when_set() -> None:
    plain = Knobs(8, 500, (8, 4), 2)
    assert "max_candidate_sequences" not in plain.to_dict()
    assert "cand" not in plain.label()
    with_cand = Knobs(8, 500, (8, 4), 2, max_candidate_sequences=6)
    assert with_cand.to_dict()["max_candidate_sequences"] == 6
    assert with_cand.label() == "mbs=8 delay=500us pref=[8,4] x2 cand=6"
    assert Knobs.from_dict(with_cand.to_dict()) == with_cand
    assert Knobs.from_dict(plain.to_dict()) == plain
    with pytest.raises(ValueError, match="must be >= 1"):
        Knobs(8, max_candidate_sequences=0)


def test_knobs_a_sequence_model_has_no_place_for_are_refused() -> None:
    base = _oldest()
    with pytest.raises(ValueError, match="no priority levels"):
        apply_knobs(base, Knobs(8, queue_policy=QueuePolicyKnob(2, 2)))
    with pytest.raises(ValueError, match="no response cache"):
        apply_knobs(base, Knobs(8, response_cache=True))
    with pytest.raises(ValueError, match="always batches"):
        apply_knobs(base, Knobs(8, dynamic_batching=False))
    with pytest.raises(ValueError, match="direct strategy"):
        apply_knobs(accumulator_config("d", oldest=False), Knobs(8, 100))
    stateless = mc.ModelConfig(name="plain", max_batch_size=8)
    with pytest.raises(ValueError, match="oldest strategy"):
        apply_knobs(stateless, Knobs(8, max_candidate_sequences=4))


def test_the_scenario_choices_refuse_what_a_sequence_model_cannot_take() -> None:
    base = _oldest()
    with pytest.raises(InputError, match="sequence batcher"):
        response_cache_choices("search", base)
    with pytest.raises(InputError, match="sequence batcher"):
        queue_policy_choices("search", 2, 100.0, base=base)
    with pytest.raises(InputError, match="sequence batcher"):
        queue_policy_choices("off", 2, 100.0, base=base)
    assert queue_policy_choices(None, 2, 100.0, base=base) == (None,)


def test_candidate_choices() -> None:
    base = _oldest()
    assert candidate_choices(None, base) == (None,)
    assert candidate_choices((16, 4, 8, 4), base) == (4, 8, 16)
    with pytest.raises(InputError, match=">= 1"):
        candidate_choices((0, 4), base)
    with pytest.raises(InputError, match=">= 1"):
        candidate_choices((), base)
    with pytest.raises(InputError, match="oldest strategy"):
        candidate_choices((4,), accumulator_config("d", oldest=False))
    with pytest.raises(InputError, match="oldest strategy"):
        candidate_choices((4,), mc.ModelConfig(name="plain", max_batch_size=8))
