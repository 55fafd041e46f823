"""A generative engine's knobs: their names per engine, the files a trial loads, the space."""

from __future__ import annotations

import json

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import EngineKnobs, command_values, engine_settings
from analyzer.config.pipeline import (
    ENGINE_FILE_KEY,
    Tuned,
    config_cost,
    engine_of,
    knob_cells,
    knobs_from_dict,
)
from analyzer.config.scenario import load_scenario
from analyzer.search.space import EngineSpace, grid_configs
from analyzer.sweep.loop import engine_space_for

KNOBS = EngineKnobs(8, 2048, True, 0.8)


def test_engine_knobs_round_trip_through_the_result_files() -> None:
    for knobs in (KNOBS, EngineKnobs(4, 512, False), EngineKnobs(2, 256, True, None, 2)):
        assert knobs_from_dict(knobs.to_dict()) == knobs
    assert KNOBS.label() == "seqs=8 tokens=2048 chunked mem=0.8 x1"
    assert knob_cells(KNOBS) == ("8", "2048", "chunked", "1")
    assert config_cost(EngineKnobs(4, 512)) < config_cost(EngineKnobs(8, 512))


def test_bad_engine_knobs_are_refused_with_the_rule() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        EngineKnobs(0, 2048)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        EngineKnobs(8, 2048, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="guaranteed_no_evict"):
        EngineKnobs(8, 2048, batch_scheduler_policy="fifo")


def test_each_engine_gets_the_knobs_in_its_own_names() -> None:
    assert engine_settings(KNOBS, "vllm") == {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 2048,
        "enable_chunked_prefill": True,
        "gpu_memory_utilization": 0.8,
    }
    trt = engine_settings(
        EngineKnobs(8, 2048, False, 0.8, batch_scheduler_policy="max_utilization"), "tensorrtllm"
    )
    assert trt == {
        "max_batch_size": "8",
        "max_num_tokens": "2048",
        "enable_chunked_context": "false",
        "kv_cache_free_gpu_mem_fraction": "0.8",
        "batch_scheduler_policy": "max_utilization",
    }
    sglang = engine_settings(KNOBS, "sglang")
    assert sglang["max_running_requests"] == 8
    assert sglang["chunked_prefill_size"] == 2048
    assert engine_settings(EngineKnobs(8, 2048, False), "sglang")["chunked_prefill_size"] == -1
    values = command_values(KNOBS, "sglang")
    assert values["max_num_seqs"] == values["max_running_requests"] == "8"
    assert values["enable_chunked_prefill"] == "true"
    with pytest.raises(ValueError, match="use one of"):
        engine_settings(KNOBS, "tgi")


def _vllm_model() -> mc.ModelConfig:
    config = mc.ModelConfig(name="llm", backend="vllm", max_batch_size=0)
    config.model_transaction_policy.decoupled = True
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_MODEL)
    return config


def test_a_vllm_model_is_tuned_through_its_engine_file_keeping_what_it_does_not_tune() -> None:
    own = {"model": "facebook/opt-125m", "max_num_seqs": 16, "enforce_eager": True}
    tuned = Tuned(_vllm_model(), engine="vllm", engine_file=own)
    assert tuned.knobs() == EngineKnobs(16, 2048, True, None, 1)
    (config,) = tuned.configs(KNOBS)
    assert config == _vllm_model()  # the config itself is the model's own
    written = json.loads(tuned.files(KNOBS)[ENGINE_FILE_KEY])
    assert written == {**own, **engine_settings(KNOBS, "vllm")}
    with pytest.raises(ValueError, match="do not fit"):
        from analyzer.config.knobs import Knobs

        tuned.configs(Knobs(max_batch_size=8))


def test_a_tensorrtllm_model_is_tuned_through_its_config_parameters() -> None:
    base = mc.ModelConfig(name="trt", backend="tensorrtllm", max_batch_size=64)
    base.parameters["max_num_tokens"].string_value = "4096"
    base.parameters["batch_scheduler_policy"].string_value = "guaranteed_no_evict"
    assert engine_of(base) == "tensorrtllm"
    tuned = Tuned(base, engine="tensorrtllm")
    own = tuned.knobs()
    assert own == EngineKnobs(256, 4096, True, None, 1, "guaranteed_no_evict")
    (config,) = tuned.configs(KNOBS)
    assert config.parameters["max_batch_size"].string_value == "8"
    assert config.parameters["enable_chunked_context"].string_value == "true"
    assert tuned.files(KNOBS) == {}
    # A knob left None keeps the model's own parameter.
    assert tuned.knobs_of((config,)) == EngineKnobs(8, 2048, True, 0.8, 1, "guaranteed_no_evict")


def test_the_engine_space_is_the_scenarios_values_with_the_engines_own_settings() -> None:
    scenario = load_scenario(
        None,
        {
            "space.max_num_seqs": (4, 1, 16),
            "space.max_num_batched_tokens": (1024,),
            "space.enable_chunked_prefill": "search",
        },
        env={},
    )
    tuned = Tuned(_vllm_model(), engine="vllm", engine_file={"gpu_memory_utilization": 0.7})
    space = engine_space_for(scenario, tuned)
    assert space.seqs == (1, 4, 16) and space.tokens == (1024,)
    configs = grid_configs(space)
    assert len(configs) == space.size() == 6
    assert all(isinstance(k, EngineKnobs) and k.gpu_memory_utilization == 0.7 for k in configs)
    assert {k.enable_chunked_prefill for k in configs if isinstance(k, EngineKnobs)} == {
        True,
        False,
    }
    for knobs in configs:
        assert space.decode(space.encode(knobs)) == knobs
    assert space.seeds(EngineKnobs(5, 3000))[0] == EngineKnobs(4, 1024, True, 0.7)
    assert EngineSpace().size() == 21


def test_a_command_template_takes_each_knob_by_its_vllm_or_its_engines_name() -> None:
    from analyzer.target.command import check_template, format_command

    template = (
        "python -m sglang.launch_server --port {port} --max-running-requests "
        "{max_running_requests} --chunked-prefill-size {chunked_prefill_size} "
        "--max-prefill-tokens {max_num_batched_tokens}"
    )
    check_template(template, "sglang")
    assert format_command(template, EngineKnobs(16, 4096, False), "sglang", 30000) == [
        *("python", "-m", "sglang.launch_server", "--port", "30000"),
        *("--max-running-requests", "16", "--chunked-prefill-size", "-1"),
        *("--max-prefill-tokens", "4096"),
    ]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("vllm serve m --max-num-seqs {max_num_seqs}", r"add --port \{port\}"),
        ("vllm serve m --port {port} --seqs {seqs}", r"names \{seqs\}, which is no knob"),
        ("vllm serve m --port {port} {", "--serve-command"),
    ],
)
def test_a_bad_command_template_is_refused_before_anything_starts(
    template: str, message: str
) -> None:
    from analyzer.errors import InputError
    from analyzer.target.command import check_template

    with pytest.raises(InputError, match=message):
        check_template(template, "vllm")


def test_a_trials_engine_file_travels_beside_its_config_and_is_sent_again_after_an_outage() -> None:
    import base64

    from analyzer.target.remote import RemoteTarget
    from analyzer.target.transport import Request, Response

    sent: list[Request] = []

    class Answers:
        """A server whose model is ready from a load until an unload."""

        ready = True

        def request(self, request: Request) -> Response:
            sent.append(request)
            if request.url.endswith("/unload"):
                self.ready = False
            elif request.url.endswith("/load"):
                self.ready = True
            elif request.url.endswith("/ready") and not self.ready:
                return Response(400, b"")
            return Response(200, b"")

    target = RemoteTarget("http://127.0.0.1:1", "llm", transport=Answers())
    tuned = Tuned(_vllm_model(), engine="vllm", engine_file={"model": "m"})
    (config,) = tuned.configs(KNOBS)
    target.load_config(config, files=tuned.files(KNOBS))
    loads = [r for r in sent if r.url.endswith("/v2/repository/models/llm/load")]
    (load,) = loads
    assert isinstance(load.body, dict)
    parameters = load.body["parameters"]
    assert set(parameters) == {"config", ENGINE_FILE_KEY}
    assert json.loads(base64.b64decode(parameters[ENGINE_FILE_KEY]))["max_num_seqs"] == 8
    sent.clear()
    target.reload_last()  # a server that came back gets the file again
    (again,) = [r for r in sent if r.url.endswith("/load")]
    assert again.body == load.body
    sent.clear()
    target.load_config(config)  # the original: the server's own files
    (plain,) = [r for r in sent if r.url.endswith("/load")]
    assert isinstance(plain.body, dict) and set(plain.body["parameters"]) == {"config"}
