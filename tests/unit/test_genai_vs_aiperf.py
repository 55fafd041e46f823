"""Pure helpers of benchmarks/genai_vs_aiperf.py: AIPerf's export and perfsweep's load document
read into the same figures, the ratios, the claims, and the commands both tools are given."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import benchmarks.genai_vs_aiperf as bench
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import LoadMode
from analyzer.measure.tokens import TokenStats

# AIPerf 0.13.0's profile_export_aiperf.json of 40 streams at 4 req/s against the reference
# engine (128 input, 64 output tokens), cut to the metrics the benchmark reads.
AIPERF_EXPORT = {
    "schema_version": "1.4",
    "aiperf_version": "0.13.0",
    "time_to_first_token": {"unit": "ms", "avg": 25.284, "p50": 25.242, "p99": 33.203, "count": 40},
    "inter_token_latency": {"unit": "ms", "avg": 10.91, "p50": 10.909, "p99": 11.292, "count": 40},
    "inter_chunk_latency": {"unit": "ms", "avg": 10.91, "p50": 10.721, "p99": 17.446},
    "output_token_throughput": {"unit": "tokens/sec", "avg": 239.368},
    "request_count": {"unit": "requests", "avg": 40.0},
}


def _load_doc(tokens: TokenStats | None) -> dict:
    level = Measurement(
        mode=LoadMode.REQUEST_RATE,
        target=4.0,
        throughput_rps=4.0,
        p50_ms=718.0,
        p90_ms=734.0,
        p95_ms=740.0,
        p99_ms=765.0,
        request_count=49,
        error_count=0,
        stable=True,
        valid=True,
        send_lag_p99_ms=2.0,
        server=None,
        tokens=tokens,
    )
    return {"format_version": 1, "kind": "perfsweep.load", "results": [level.to_dict()]}


TOKENS = TokenStats(
    ttft_p50_ms=27.9,
    ttft_p99_ms=36.0,
    itl_p50_ms=10.8,
    itl_p99_ms=22.4,
    mean_itl_p50_ms=10.9,
    mean_itl_p99_ms=11.8,
    streams=49,
    failed_streams=0,
    input_tokens=6272,
    output_tokens=3136,
    output_tokens_per_s=250.0,
)


def test_aiperf_export_read_as_its_own_definitions() -> None:
    figures = bench.aiperf_figures(AIPERF_EXPORT)
    assert figures == bench.Figures(
        ttft_p99_ms=33.203,
        itl_p99_ms=11.292,  # AIPerf's ITL: each request's mean gap, p99 over requests
        output_tokens_per_s=239.368,
        requests=40,
        gap_p99_ms=17.446,  # every chunk's gap
        ttft_p50_ms=25.242,
        itl_p50_ms=10.909,
    )
    # Older exports keep the metrics under "records".
    assert bench.aiperf_figures({"records": AIPERF_EXPORT}) == figures


def test_aiperf_export_without_streams_is_refused() -> None:
    broken = {k: v for k, v in AIPERF_EXPORT.items() if k != "time_to_first_token"}
    with pytest.raises(ValueError, match="time_to_first_token p99"):
        bench.aiperf_figures(broken)


def test_perfsweep_figures_take_the_per_request_itl() -> None:
    figures = bench.perfsweep_figures(_load_doc(TOKENS))
    assert (figures.ttft_p99_ms, figures.itl_p99_ms, figures.gap_p99_ms) == (36.0, 11.8, 22.4)
    assert (figures.output_tokens_per_s, figures.requests) == (250.0, 49)
    assert figures.send_lag_p99_ms == 2.0
    # A record without TTFT from the send compares its intended-send TTFT; one with it, that.
    assert figures.ttft_intended_p99_ms == 36.0
    sent = bench.perfsweep_figures(_load_doc(replace(TOKENS, ttft_from_send_p99_ms=34.5)))
    assert (sent.ttft_p99_ms, sent.ttft_intended_p99_ms) == (34.5, 36.0)
    assert (figures.stable, figures.valid) == (True, True)
    with pytest.raises(ValueError, match="no token stream"):
        bench.perfsweep_figures(_load_doc(None))


def test_compare_and_claims() -> None:
    ours = bench.perfsweep_figures(_load_doc(TOKENS))
    theirs = bench.aiperf_figures(AIPERF_EXPORT)
    comparison = bench.compare(ours, theirs)
    assert comparison["ratios"]["ttft_p99_ms"] == pytest.approx(36.0 / 33.203)
    # TTFT 8.4 % above (within 10 %), ITL 4.5 % (within 10 %), tokens/s 4.4 % (within 5 %).
    assert comparison["within"] == {
        "ttft_p99_ms": True,
        "itl_p99_ms": True,
        "output_tokens_per_s": True,
    }
    slow = bench.compare(bench.Figures(40.0, 11.8, 260.0, 49), theirs)
    assert slow["within"] == {
        "ttft_p99_ms": False,
        "itl_p99_ms": True,
        "output_tokens_per_s": False,
    }
    engines = {"reference": {"levels": [{"comparison": comparison}, {"comparison": slow}]}}
    held = bench.claims({**engines, "vllm": {"levels": []}})
    assert held == {
        "reference: TTFT p99 within 10 % of AIPerf's at every rate": False,
        "reference: ITL p99 within 10 % of AIPerf's at every rate": True,
        "reference: tokens/s within 5 % of AIPerf's at every rate": False,
        # An engine that measured no level holds no claim.
        "vllm: TTFT p99 within 10 % of AIPerf's at every rate": False,
        "vllm: ITL p99 within 10 % of AIPerf's at every rate": False,
        "vllm: tokens/s within 5 % of AIPerf's at every rate": False,
    }


def test_both_tools_get_the_same_rate_lengths_and_arrivals(tmp_path: Path) -> None:
    aiperf = bench.aiperf_command(
        model="m",
        tokenizer=tmp_path,
        url="http://127.0.0.1:1",
        rate=1.5,
        requests=45,
        input_tokens=128,
        output_tokens=64,
        artifacts=tmp_path / "a",
    )
    ours = bench.perfsweep_command(
        model="m",
        url="127.0.0.1:1",
        rate=1.5,
        seconds=30,
        input_tokens=128,
        output_tokens=64,
        output=tmp_path / "o.json",
    )

    def after(command: list[str], flag: str) -> str:
        return command[command.index(flag) + 1]

    assert after(aiperf, "--request-rate") == after(ours, "--rate-rps") == "1.5"
    assert after(aiperf, "--request-rate-mode") == after(ours, "--arrival") == "constant"
    assert after(aiperf, "--prompt-input-tokens-mean") == after(ours, "--input-tokens") == "128"
    assert after(aiperf, "--prompt-output-tokens-mean") == after(ours, "--output-tokens") == "64"
    assert after(aiperf, "--prompt-input-tokens-stddev") == "0"
    assert {"--streaming", "--use-server-token-count"} <= set(aiperf)
    assert "ignore_eos:true" in aiperf
    assert after(ours, "--protocol") == "openai"
