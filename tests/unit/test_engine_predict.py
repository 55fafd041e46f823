"""Predicting a generative engine: step costs fitted from planted samples, the virtual-time
engine (the reference engine's own scheduler) on planted cases with known answers, its memory
(preemptions when the cache cannot hold the running set), and capacities checked against a
brute force over rates."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from analyzer.config.knobs import EngineKnobs
from analyzer.measure.arrivals import POISSON, Arrival, ArrivalProcess
from analyzer.measure.lengths import GenRequest, LengthDist, Lengths
from analyzer.measure.specs import Goals
from analyzer.measure.tokens import StreamRecord
from analyzer.predict import ProfileError
from analyzer.predict.engine_probe import decode_samples
from analyzer.predict.engine_profile import (
    DecodeSample,
    EngineConfig,
    EngineProfile,
    KvMemory,
    PrefillSample,
    engine_profile_from_toml,
    fit_steps,
    kv_blocks_from_metrics,
    with_share,
)
from analyzer.predict.engine_sim import engine_capacities, engine_capacity, simulate_engine
from analyzer.search.predictors import EnginePredictor, load_predictor
from analyzer.search.space import EngineSpace, grid_configs
from reference_server.zoo.profiles import StepCost

#: Requests that never meet: one every 2 s.
APART = ArrivalProcess(Arrival.CONSTANT)
COST = StepCost(fixed_ms=10.0, prefill_ms_per_token=0.05, decode_ms_per_seq=0.25)
#: 1013 blocks of 16 at 0.9, as tinyllm_sim's card.
MEMORY = KvMemory(memory_total_mb=24576, reserved_mb=14012, bytes_per_token=524288)
PROFILE = EngineProfile("planted", COST, memory=MEMORY)
TOKEN_GOALS = Goals(p99_ms=math.inf, ttft_p99_ms=200.0, itl_p99_ms=30.0)


def test_fit_recovers_planted_step_costs_and_offset() -> None:
    prefill = [PrefillSample(p, 3.0 + 10.0 + 0.05 * p) for p in (16, 1024) for _ in range(3)]
    decode = [DecodeSample(k, 10.0 + 0.25 * k) for k in (1, 2, 4, 8) for _ in range(5)]
    # one hiccup per size: the medians ignore it
    decode += [DecodeSample(k, 90.0) for k in (1, 2, 4, 8)]
    p = fit_steps("m", prefill, decode, kv_blocks=(0.9, 1013, 16))
    assert p.cost.fixed_ms == pytest.approx(10.0, abs=1e-3)
    assert p.cost.decode_ms_per_seq == pytest.approx(0.25, abs=1e-4)
    assert p.cost.prefill_ms_per_token == pytest.approx(0.05, abs=1e-5)
    assert p.latency_offset_ms == pytest.approx(3.0, abs=1e-2)
    assert p.probed_seqs == 8
    with pytest.raises(ProfileError, match="two concurrencies"):
        fit_steps("m", prefill, [DecodeSample(1, 10.25)])


def test_decode_samples_keep_the_steady_gaps_after_every_request_started() -> None:
    records = []
    for start in (0.000, 0.005):
        r = StreamRecord(intended=0.0, sent=0.0)
        r.token(0.050 + start)
        for i in range(1, 8):
            r.token(0.060 + 0.0105 * i)
        records.append(r)
    samples = decode_samples(2, records)
    assert samples and all(s.itl_ms == pytest.approx(10.5) for s in samples)
    # a server that sends two tokens a chunk: each is one step of half the chunk's gap
    paired = StreamRecord(intended=0.0, sent=0.0)
    paired.token(0.050)
    for i in range(1, 6):
        paired.token(0.060 + 0.021 * i, 2)
    assert {round(s.itl_ms, 6) for s in decode_samples(1, [paired])} == {10.5}


def test_kv_cache_size_is_read_from_either_engines_metrics() -> None:
    vllm = (
        'vllm:cache_config_info{block_size="16",gpu_memory_utilization="0.85",'
        'num_gpu_blocks="2048",enable_prefix_caching="False"} 1.0\n'
    )
    assert kv_blocks_from_metrics(vllm) == (0.85, 2048, 16)
    reference = 'vllm:num_kv_cache_blocks_total{model_name="tinyllm"} 1013\n'
    read = kv_blocks_from_metrics(reference)
    assert read is not None and read[1] == 1013
    assert with_share(read, EngineConfig(gpu_memory_utilization=0.9)) == (0.9, 1013, 16)
    assert kv_blocks_from_metrics("nv_inference_count 3\n") is None


def test_engine_settings_are_read_as_the_reference_engine_reads_model_json() -> None:
    config = EngineConfig.from_settings(
        {"model": "m", "max_num_seqs": "8", "enable_chunked_prefill": "false", "block_size": 32}
    )
    assert config == EngineConfig(max_num_seqs=8, enable_chunked_prefill=False, block_size=32)
    with pytest.raises(ProfileError, match="max_num_seqs"):
        EngineConfig.from_settings({"max_num_seqs": 0})


def test_memory_share_gives_the_reference_engines_blocks() -> None:
    bundled = engine_profile_from_toml("tinyllm_sim", "tinyllm")
    assert bundled.num_blocks(EngineConfig(gpu_memory_utilization=0.9)) == 1013
    assert bundled.num_blocks(EngineConfig(gpu_memory_utilization=0.5)) == 0  # weights fill it
    assert not EnginePredictor(bundled, TOKEN_GOALS, Lengths()).covers(
        EngineKnobs(8, 2048, gpu_memory_utilization=0.5)
    )
    # A probed engine's cache is known at its own share only.
    probed = EngineProfile("p", COST, kv_blocks=(0.9, 1000, 16))
    assert probed.covers(EngineConfig(gpu_memory_utilization=0.9))
    assert not probed.covers(EngineConfig(gpu_memory_utilization=0.8))
    assert probed.num_blocks(EngineConfig(block_size=32)) == 500


def _lone(prompt: int, output: int, offset_ms: float = 0.0) -> tuple[float, float]:
    """TTFT and ITL of requests that never meet (one every 2 s)."""
    profile = EngineProfile("planted", COST, latency_offset_ms=offset_ms, memory=MEMORY)
    lengths = [GenRequest(prompt, output)]
    config = EngineConfig(max_num_seqs=8)
    p = simulate_engine(profile, config, 0.5, lengths, requests=50, arrival=APART)
    return p.ttft_p99_ms, p.itl_p99_ms


def test_a_lone_request_costs_one_prefill_step_then_one_decode_step_a_token() -> None:
    ttft, itl = _lone(100, 8)
    assert ttft == pytest.approx(10.0 + 0.05 * 100)
    assert itl == pytest.approx(10.0 + 0.25)
    ttft, _ = _lone(100, 8, offset_ms=4.0)
    assert ttft == pytest.approx(4.0 + 10.0 + 0.05 * 100)


def test_a_prompt_over_the_budget_is_chunked_or_never_served() -> None:
    lengths = [GenRequest(3000, 4)]
    chunked = simulate_engine(
        PROFILE, EngineConfig(max_num_batched_tokens=1024), 0.5, lengths, requests=20, arrival=APART
    )
    # three prefill steps: 1024 + 1024 + 952 tokens
    assert chunked.ttft_p99_ms == pytest.approx(3 * 10.0 + 0.05 * 3000)
    whole = EngineConfig(max_num_batched_tokens=1024, enable_chunked_prefill=False)
    refused = simulate_engine(PROFILE, whole, 0.5, lengths, requests=20)
    assert "over max_num_batched_tokens" in refused.unservable
    assert engine_capacity(PROFILE, whole, TOKEN_GOALS, lengths).capacity_rps == 0.0


def test_a_cache_too_small_for_the_running_set_preempts() -> None:
    lengths = [GenRequest(128, 512)]
    # 48 blocks of 16: a prompt takes 8, so several are admitted, but a whole sequence (640
    # tokens, 40 blocks) leaves room for no other: growing sequences preempt each other.
    small = EngineProfile("small", COST, kv_blocks=(0.9, 48, 16))
    roomy = EngineProfile("roomy", COST, kv_blocks=(0.9, 4800, 16))
    config = EngineConfig(max_num_seqs=8)
    tight = simulate_engine(small, config, 2.0, lengths, requests=60)
    loose = simulate_engine(roomy, config, 2.0, lengths, requests=60)
    assert tight.preemptions > 0 and tight.kv_peak > 0.9
    assert loose.preemptions == 0
    assert tight.output_tokens_per_s < loose.output_tokens_per_s


def _brute_force(config: EngineConfig, lengths: list[GenRequest], rates: list[float]) -> float:
    """The highest rate of ``rates`` (ascending) below which every rate meets the goals."""
    best = 0.0
    for rate in rates:
        p = simulate_engine(PROFILE, config, rate, lengths, requests=200, goals=TOKEN_GOALS)
        if not p.meets(TOKEN_GOALS):
            break
        best = rate
    return best


def test_capacity_search_agrees_with_a_brute_force_over_rates() -> None:
    lengths = Lengths(LengthDist("fixed", 128), LengthDist("fixed", 16)).draw(0, 64)
    rates = [float(r) for r in range(2, 121, 3)]
    configs = [EngineConfig(max_num_seqs=s) for s in (1, 4, 16)]
    found = engine_capacities(PROFILE, configs, TOKEN_GOALS, lengths, requests=400, resolution=0.02)
    brute = {c: _brute_force(c, lengths, rates) for c in configs}
    for c in configs:
        # within the search's resolution and the brute force's 3 req/s grid
        assert found[c].capacity_rps == pytest.approx(brute[c], abs=0.03 * brute[c] + 3.0)
    # more sequences decode together: the larger running set serves more within the goals
    assert brute[configs[0]] < brute[configs[1]] < brute[configs[2]]
    assert max(found, key=lambda c: found[c].capacity_rps) == max(brute, key=brute.__getitem__)


def test_decoding_sequences_stretch_every_step() -> None:
    """Each decoding sequence adds 0.25 ms to every step, and an admitted prompt's prefill rides
    in a step of decodes: a larger running set under heavy load has longer gaps."""
    lengths = [GenRequest(16, 64)]
    few = simulate_engine(PROFILE, EngineConfig(max_num_seqs=8), 400.0, lengths, requests=300)
    many = simulate_engine(PROFILE, EngineConfig(max_num_seqs=64), 400.0, lengths, requests=300)
    assert few.itl_p50_ms == pytest.approx(10.0 + 0.25 * 8)
    assert many.itl_p50_ms > few.itl_p50_ms + 0.25 * 32
    assert many.output_tokens_per_s > 3 * few.output_tokens_per_s


def test_engine_predictor_predicts_a_space_and_survives_a_save(tmp_path: Path) -> None:
    lengths = Lengths(LengthDist("fixed", 128), LengthDist("fixed", 16))
    predictor = EnginePredictor(PROFILE, TOKEN_GOALS, lengths, share=0.9)
    space = EngineSpace(seqs=(2, 16), tokens=(512, 2048))
    configs = grid_configs(space)
    assert all(predictor.covers(k) for k in configs)
    caps = predictor.capacities(
        configs,
        math.inf,
        requests=200,
        seed=0,
        resolution=0.05,
        workers=1,
        ceiling_rps=math.inf,
        arrival=POISSON,
    )
    assert set(caps) == set(configs) and all(v > 0 for v in caps.values())
    best = max(configs, key=lambda k: caps[k])
    assert isinstance(best, EngineKnobs) and best.max_num_seqs > 2
    path = tmp_path / "profile.json"
    predictor.save(path)
    back = load_predictor(path)
    assert isinstance(back, EnginePredictor)
    assert back.profile == PROFILE and back.goals.itl_p99_ms == 30.0
    assert back.lengths.describe() == lengths.describe()


def test_calibration_rescales_the_costs_and_finds_the_offset() -> None:
    """Operating points "measured" on an engine twice as slow as probed, 6 ms away from its
    client, whose slowest gaps reach the client 3 ms late: the calibrated predictor predicts
    them."""
    lengths = Lengths(LengthDist("fixed", 64), LengthDist("fixed", 16))
    drawn = lengths.draw(0)
    true = EngineProfile(
        "true",
        StepCost(20.0, 0.1, 0.5),
        latency_offset_ms=6.0,
        memory=MEMORY,
    )
    knobs = [EngineKnobs(8, 2048, gpu_memory_utilization=0.9), EngineKnobs(4, 2048)]
    predictor = EnginePredictor(PROFILE, TOKEN_GOALS, lengths, share=0.9)
    points = []
    for k, rate in zip(knobs, (10.0, 6.0), strict=True):
        m = simulate_engine(true, predictor.config(k), rate, drawn, requests=400)
        points.append((k, rate, m.ttft_p99_ms, m.itl_p50_ms, m.itl_p99_ms + 3.0))
    fitted = predictor.calibrated_on(points, requests=400, seed=0, arrival=POISSON)
    assert fitted.profile.cost.fixed_ms == pytest.approx(20.0, rel=0.02)
    assert fitted.profile.cost.decode_ms_per_seq == pytest.approx(0.5, rel=0.02)
    assert fitted.profile.latency_offset_ms == pytest.approx(6.0, abs=1.0)
    assert fitted.profile.itl_tail_ms == pytest.approx(3.0, abs=0.5)
    assert fitted.probed == PROFILE  # the next calibration starts from the probe again
    assert predictor.calibrated_on([], requests=400, seed=0, arrival=POISSON) is predictor


def test_the_shortcut_never_changes_a_verdict() -> None:
    """A run stopped once a goal's p99 is certain to be missed judges as the whole run does."""
    lengths = [GenRequest(128, 16)]
    goals = Goals(p99_ms=math.inf, ttft_p99_ms=120.0, itl_p99_ms=18.0)
    config = EngineConfig(max_num_seqs=16)
    verdicts = set()
    for rate in (2.0, 10.0, 40.0, 80.0):
        short = simulate_engine(PROFILE, config, rate, lengths, requests=300, goals=goals)
        whole = simulate_engine(
            PROFILE, config, rate, lengths, requests=300, goals=goals, stop_early=False
        )
        assert short.meets(goals) == whole.meets(goals)
        verdicts.add(whole.meets(goals))
        if short.stopped_early:
            assert not whole.meets(goals)
    assert verdicts == {True, False}  # both sides of the capacity were tried
