"""The reference engine's pure parts: engine settings, KV-cache size, step time, request parsing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from reference_server.backends.generative import (
    EngineSettings,
    kv_cache_blocks,
    parse_request,
    prompt_tokens_of,
)
from reference_server.batching.iteration import (
    EngineLimits,
    EngineState,
    Seq,
    complete_step,
    decide_step,
)
from reference_server.core.errors import ModelConfigError, ServerError
from reference_server.core.types import InferRequest
from reference_server.zoo.profiles import StepCost, resolve_profile


def test_kv_blocks_follow_the_memory_share_formula() -> None:
    profile = resolve_profile("tinyllm_sim")
    assert profile.gpu is not None and profile.kv is not None
    # floor((24576 MiB * 0.9 - 13500 weights - 512 context) * MiB / (512 KiB * 16 tokens))
    assert kv_cache_blocks(EngineSettings(gpu_memory_utilization=0.9), profile) == 1013
    assert kv_cache_blocks(EngineSettings(gpu_memory_utilization=0.6), profile) == 91
    # a larger block holds more tokens: fewer blocks, same memory
    assert kv_cache_blocks(EngineSettings(block_size=32), profile) == 506
    with pytest.raises(ModelConfigError, match="raise gpu_memory_utilization"):
        kv_cache_blocks(EngineSettings(gpu_memory_utilization=0.5), profile)


def test_step_time_grows_with_prefill_tokens_and_decoding_sequences() -> None:
    cost = resolve_profile("tinyllm_sim").step
    assert cost == StepCost(fixed_ms=10.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.25)
    assert cost.ms(0, 0) == 0.0
    assert cost.ms(0, 1) == pytest.approx(10.25)
    assert cost.ms(512, 0) == pytest.approx(10 + 25.6)
    assert cost.ms(100, 8) == pytest.approx(10 + 5 + 2)
    # batching pays: 8 sequences decoding together cost far less than 8 steps of one
    assert 8 * cost.ms(0, 1) / cost.ms(0, 8) > 6


def test_engine_settings_read_vllm_names_and_ignore_the_rest() -> None:
    data = {
        "model": "x",
        "disable_log_requests": True,
        "max_num_seqs": 4,
        "max_num_batched_tokens": "512",
        "enable_chunked_prefill": "false",
        "gpu_memory_utilization": 0.8,
    }
    settings = EngineSettings.from_json(data, "m/1/model.json")
    assert settings == EngineSettings(4, 512, False, 0.8, 16)
    with pytest.raises(ModelConfigError, match="'max_num_seqs' must be a positive integer"):
        EngineSettings.from_json({"max_num_seqs": 0}, "m/1/model.json")
    with pytest.raises(ModelConfigError, match=r"must be in \(0, 1\]"):
        EngineSettings.from_json({"gpu_memory_utilization": 1.5}, "m/1/model.json")
    with pytest.raises(ModelConfigError, match="JSON object"):
        EngineSettings.from_json([], "m/1/model.json")


def _request(**inputs: object) -> InferRequest:
    req = InferRequest(model_name="m")
    for name, value in inputs.items():
        if isinstance(value, bool):
            req.inputs[name] = np.array([value])
        else:
            req.inputs[name] = np.array([str(value).encode()], dtype=np.object_)
    return req


def test_requests_are_read_as_triton_vllm_backend_reads_them() -> None:
    params = parse_request(
        _request(
            text_input="a b  c",
            stream=True,
            sampling_parameters=json.dumps({"max_tokens": 9, "min_tokens": 2, "ignore_eos": True}),
        )
    )
    assert (params.prompt_tokens, params.max_tokens, params.min_tokens) == (3, 9, 2)
    assert params.stream and params.ignore_eos and not params.exclude_input
    # without sampling_parameters, the request's parameters (the generate extension's way)
    req = _request(text_input="x")
    req.parameters.update({"max_tokens": 4, "stream": True})
    params = parse_request(req)
    assert params.max_tokens == 4 and params.stream
    assert parse_request(_request(text_input="x")).max_tokens == 16  # vLLM's default
    with pytest.raises(ServerError, match="not JSON"):
        parse_request(_request(text_input="x", sampling_parameters="{"))
    with pytest.raises(ServerError, match="min_tokens"):
        parse_request(
            _request(text_input="x", sampling_parameters='{"max_tokens": 2, "min_tokens": 3}')
        )
    assert prompt_tokens_of("  one two\tthree\n") == 3


def _virtual_run(
    limits: EngineLimits, cost: StepCost, requests: list[tuple[float, int, int]]
) -> dict[str, list[float]]:
    """Step the engine's scheduler in virtual time: per request, the time of each token (ms)."""
    state = EngineState.empty(limits)
    clock = 0.0
    times: dict[str, list[float]] = {str(i): [] for i in range(len(requests))}
    pending = sorted(range(len(requests)), key=lambda i: requests[i][0])
    while pending or not state.idle:
        while pending and requests[pending[0]][0] <= clock:
            i = pending.pop(0)
            state = state.add(Seq(str(i), requests[i][1], requests[i][2]))
        if state.idle:
            clock = requests[pending[0]][0]
            continue
        step = decide_step(limits, state)
        clock += cost.ms(step.prefill_tokens, step.decode_seqs)
        done = complete_step(step)
        for seq_id in done.sampled:
            times[seq_id].append(clock)
        state = done.state
    return times


def test_the_scheduler_steps_in_virtual_time_with_the_profiles_costs() -> None:
    cost = resolve_profile("tinyllm_sim").step
    assert cost is not None
    lim = EngineLimits(1, 2048, True, num_blocks=1013, block_size=16)
    # max_num_seqs 1: the second request waits for the first to finish
    times = _virtual_run(lim, cost, [(0.0, 100, 3), (0.0, 100, 2)])
    assert times["0"] == pytest.approx([15.0, 25.25, 35.5])  # 10 + 100 x 0.05, then decodes
    assert times["1"] == pytest.approx([50.5, 60.75])
    # max_num_seqs 2: both prefill in one step, then decode together
    lim2 = EngineLimits(2, 2048, True, num_blocks=1013, block_size=16)
    times = _virtual_run(lim2, cost, [(0.0, 100, 3), (0.0, 100, 2)])
    assert times["0"] == pytest.approx([20.0, 30.5, 40.75]) and times["1"] == pytest.approx(
        [20.0, 30.5]
    )
