"""``response_cache { enable }`` as a knob: rendering, reading back, choices, the server flag."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.choices import cache_server_args, needs_server_cache, response_cache_choices
from analyzer.config.knobs import DEFAULT_CACHE_SIZE_BYTES, Knobs
from analyzer.config.model_config import apply_knobs, knobs_of
from analyzer.errors import InputError
from reference_server.core.cache import resolve_cache_size
from reference_server.core.config import config_to_text


def _config(extra: str = "") -> mc.ModelConfig:
    return text_format.Parse(
        'name: "m" backend: "identity" max_batch_size: 8 '
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }] '
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }] ' + extra,
        mc.ModelConfig(),
    )


def test_the_knob_renders_into_the_config_and_reads_back() -> None:
    on = apply_knobs(_config(), Knobs(8, response_cache=True))
    assert "response_cache {\n  enable: true\n}" in config_to_text(on)
    assert knobs_of(on).response_cache is True
    off = apply_knobs(_config("response_cache { enable: true }"), Knobs(8, response_cache=False))
    assert not off.HasField("response_cache")
    assert knobs_of(off).response_cache is None


def test_unset_keeps_the_base_config_s_cache() -> None:
    base = _config("response_cache { enable: true }")
    assert apply_knobs(base, Knobs(8)).response_cache.enable
    assert not apply_knobs(_config(), Knobs(8)).HasField("response_cache")


def test_dict_and_label_name_the_cache_only_when_set() -> None:
    plain = Knobs(16, 500, (16, 8), 2)
    assert "response_cache" not in plain.to_dict()
    assert plain.label() == "mbs=16 delay=500us pref=[16,8] x2"
    cached = Knobs(16, 500, (16, 8), 2, response_cache=True)
    assert cached.to_dict()["response_cache"] is True
    assert cached.label() == "mbs=16 delay=500us pref=[16,8] x2 cache"
    assert Knobs(4, response_cache=False).label().endswith(" no cache")
    for knobs in (plain, cached, Knobs(4, response_cache=False)):
        assert Knobs.from_dict(knobs.to_dict()) == knobs


@pytest.mark.parametrize(
    ("setting", "choices"),
    [(None, (None,)), ("off", (False,)), ("on", (True,)), ("search", (False, True))],
)
def test_choices_per_setting(setting: str | None, choices: tuple[bool | None, ...]) -> None:
    assert response_cache_choices(setting, _config()) == choices  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ("sequence_batching {}", "uses the sequence batcher"),
        ("model_transaction_policy { decoupled: true }", "is decoupled"),
    ],
)
def test_a_model_triton_cannot_cache_is_refused_up_front(extra: str, reason: str) -> None:
    with pytest.raises(InputError) as caught:
        response_cache_choices("search", _config(extra))
    assert reason in str(caught.value) and "space.response_cache = 'off'" in str(caught.value)
    assert response_cache_choices("off", _config(extra)) == (False,)


def test_the_managed_server_gets_a_cache_when_a_trial_can_enable_it() -> None:
    assert needs_server_cache("search", _config())
    assert needs_server_cache("on", _config())
    assert not needs_server_cache("off", _config("response_cache { enable: true }"))
    assert needs_server_cache(None, _config("response_cache { enable: true }"))
    assert not needs_server_cache(None, _config())
    args = cache_server_args(DEFAULT_CACHE_SIZE_BYTES)
    assert args == ["--cache-config=local,size=67108864"]
    # The flag is one the reference server parses to that size.
    assert resolve_cache_size(0, [args[0].split("=", 1)[1]]) == DEFAULT_CACHE_SIZE_BYTES
    with pytest.raises(InputError):
        cache_server_args(0)
