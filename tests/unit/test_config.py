"""config.pbtxt parsing, normalization, validation and JSON rendering (triton_spec §2.2-2.4)."""

from __future__ import annotations

import json

import pytest

from reference_server.core.config import (
    config_from_json,
    config_to_json,
    config_to_text,
    normalize,
    parse_config_text,
    validate,
)
from reference_server.core.errors import Code, ModelConfigError

BASE = """
name: "m"
backend: "identity"
max_batch_size: 8
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }
"""


def check(text: str, dir_name: str = "m", gpu_ids: tuple[int, ...] = ()) -> None:
    cfg = normalize(parse_config_text(text), model_name=dir_name, gpu_ids=gpu_ids)
    validate(cfg, dir_name=dir_name, gpu_ids=gpu_ids)


def test_defaults_filled_like_triton() -> None:
    cfg = normalize(parse_config_text(BASE + "dynamic_batching {}"), model_name="m")
    out = config_to_json(cfg)
    assert out["version_policy"] == {"latest": {"num_versions": 1}}
    assert out["dynamic_batching"]["preferred_batch_size"] == [8]
    assert out["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    assert out["optimization"]["input_pinned_memory"] == {"enable": True}
    assert out["instance_group"] == [
        {
            "name": "m",
            "kind": "KIND_CPU",
            "count": 1,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ]


def test_json_rendering_int64_fields_and_map_keys() -> None:
    cfg = normalize(
        parse_config_text(
            BASE
            + """dynamic_batching { max_queue_delay_microseconds: 100 priority_levels: 2
                 default_priority_level: 2
                 priority_queue_policy { key: 1 value { default_timeout_microseconds: 500 } } }"""
        ),
        model_name="m",
    )
    out = config_to_json(cfg)
    db = out["dynamic_batching"]
    assert db["max_queue_delay_microseconds"] == 100
    assert db["priority_levels"] == 2
    assert list(db["priority_queue_policy"]) == ["1"], "map keys stay strings"
    assert db["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 500
    assert out["input"][0]["dims"] == [16]
    assert out["platform"] == "" and out["parameters"] == {} and out["metric_tags"] == {}
    json.dumps(out)


def test_unnamed_groups_and_instance_kinds() -> None:
    cfg = normalize(
        parse_config_text(BASE + "instance_group [{count: 2}, {kind: KIND_AUTO}]"),
        model_name="m",
    )
    assert [(g.name, g.count) for g in cfg.instance_group] == [("m_0", 2), ("m_1", 1)]
    gpu = normalize(parse_config_text(BASE + "instance_group [{}]"), model_name="m", gpu_ids=[0, 1])
    assert list(gpu.instance_group[0].gpus) == [0, 1]


def test_onnxruntime_cpu_group_defaults_to_two_instances() -> None:
    text = BASE.replace('backend: "identity"', 'platform: "onnxruntime_onnx"')
    cfg = normalize(parse_config_text(text + "instance_group [{kind: KIND_CPU}]"), model_name="m")
    assert cfg.backend == "onnxruntime"
    assert cfg.instance_group[0].count == 2


def test_name_filled_from_directory_and_must_match() -> None:
    cfg = normalize(parse_config_text(BASE.replace('name: "m"', "")), model_name="dir")
    assert cfg.name == "dir"
    with pytest.raises(ModelConfigError, match="unexpected directory name 'other' for model 'm'"):
        check(BASE, dir_name="other")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "dynamic_batching { preferred_batch_size: [16] }",
            "preferred size must be <= max batch size for m",
        ),
        ("dynamic_batching { preferred_batch_size: [0] }", "preferred size must be positive for m"),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 0 }",
            r"default priority level must be in range \[1, 2\] for m",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
            r"default priority level must be in range \[1, 2\] for m",
        ),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
            "priority_queue_policy { key: 3 value {} } }",
            "priority queue policy must have priority level in range",
        ),
        (
            "dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
            "preserve_ordering",
        ),
        (
            "dynamic_batching { preserve_ordering: true default_queue_policy "
            "{ timeout_action: DELAY default_timeout_microseconds: 10 } }",
            "DELAY",
        ),
        ("response_cache { enable: true } sequence_batching {}", "sequence batching"),
        (
            "response_cache { enable: true } model_transaction_policy { decoupled: true }",
            "decoupled",
        ),
        (
            "instance_group [{ kind: KIND_GPU }]",
            "instance group m_0 of model m has kind KIND_GPU but no GPUs are available",
        ),
        ("instance_group [{ kind: KIND_CPU gpus: [0] }]", "specifies one or more GPUs"),
    ],
)
def test_invalid_configs_refused_with_triton_messages(extra: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message) as info:
        check(BASE + extra)
    assert info.value.code is Code.INVALID_ARG


def test_negative_max_batch_size_refused() -> None:
    with pytest.raises(ModelConfigError, match="'max_batch_size' must be non-negative value for m"):
        check(BASE.replace("max_batch_size: 8", "max_batch_size: -1"))


def test_preferred_with_zero_max_batch_size_refused_but_batching_allowed() -> None:
    zero = BASE.replace("max_batch_size: 8", "max_batch_size: 0")
    check(zero + "dynamic_batching {}")
    with pytest.raises(ModelConfigError, match="<= max batch size"):
        check(zero + "dynamic_batching { preferred_batch_size: [1] }")


def test_kind_gpu_accepted_when_gpus_exist() -> None:
    check(BASE + "instance_group [{ kind: KIND_GPU gpus: [0] }]", gpu_ids=(0,))
    with pytest.raises(ModelConfigError, match="invalid or unsupported gpu id 3"):
        check(BASE + "instance_group [{ kind: KIND_GPU gpus: [3] }]", gpu_ids=(0,))


def test_text_parse_errors_are_model_config_errors() -> None:
    with pytest.raises(ModelConfigError, match="failed to parse"):
        parse_config_text("max_batch_size: 'eight'")
    with pytest.raises(ModelConfigError, match="failed to parse"):
        parse_config_text("no_such_field: 1")


def test_json_override_round_trip_and_errors() -> None:
    cfg = normalize(
        parse_config_text(BASE + "dynamic_batching { max_queue_delay_microseconds: 7 }"),
        model_name="m",
    )
    again = config_from_json(json.dumps(config_to_json(cfg)))
    assert again == cfg
    camel = config_from_json('{"name": "m", "maxBatchSize": 4}')
    assert camel.max_batch_size == 4
    with pytest.raises(ModelConfigError, match=r"^Invalid config override: "):
        config_from_json('{"name": "m", "bogus": 1}')
    with pytest.raises(ModelConfigError, match=r"^Invalid config override: "):
        config_from_json("{not json")


def test_text_round_trip() -> None:
    cfg = normalize(
        parse_config_text(BASE + "dynamic_batching { preferred_batch_size: [2, 4] }"),
        model_name="m",
    )
    assert parse_config_text(config_to_text(cfg)) == cfg
