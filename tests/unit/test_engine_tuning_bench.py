"""Pure helpers of benchmarks/engine_tuning.py: an answer's key and engine settings, the
simulator's errors, the claims."""

from __future__ import annotations

import pytest

import benchmarks.engine_tuning as bench

ANSWER = {
    "engine": True,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 512,
    "enable_chunked_prefill": True,
    "instance_count": 1,
    "gpu_memory_utilization": 0.9,
}


def test_an_answer_is_keyed_by_its_running_set_and_token_budget() -> None:
    assert bench.engine_key(ANSWER) == (16, 512)
    assert bench.engine_key({"max_num_seqs": "4", "max_num_batched_tokens": 2048.0}) == (4, 2048)


def test_an_answer_reaches_the_judge_as_the_reference_servers_engine_settings() -> None:
    assert bench.engine_settings(ANSWER) == [
        "--engine-setting",
        "max_num_seqs=16",
        "--engine-setting",
        "max_num_batched_tokens=512",
        "--engine-setting",
        "enable_chunked_prefill=true",
        "--engine-setting",
        "gpu_memory_utilization=0.9",
    ]
    assert bench.engine_settings({"max_num_seqs": 2, "enable_chunked_prefill": False}) == [
        "--engine-setting",
        "max_num_seqs=2",
        "--engine-setting",
        "enable_chunked_prefill=false",
    ]


def test_errors_leave_out_unknown_and_zero_measurements() -> None:
    found = bench.errors([(11.0, 10.0), (8.0, 10.0), (None, 5.0), (3.0, None), (4.0, 0.0)])
    assert found["n"] == 2
    assert found["median"] == pytest.approx(0.15)
    assert found["worst"] == pytest.approx(0.2)
    assert bench.errors([])["median"] is None


def _result(predict_rps: float, predict_wall: float, median: float | None) -> dict:
    return {
        "runs": {
            "grid": {"answer": ANSWER, "wall_s": 400.0},
            "predict": {
                "answer": {**ANSWER, "max_num_batched_tokens": 2048},
                "wall_s": predict_wall,
            },
        },
        "judged": {},
        "aiperf": {
            "answers": {
                str((16, 512)): {"goodput_rps": 20.0},
                str((16, 2048)): {"goodput_rps": predict_rps},
            }
        },
        "simulator_error": {"forecast_vs_judge_on_predicts_configs": {"median": median}},
    }


def test_claims_judge_aiperfs_goodput_wall_time_and_error_against_their_thresholds() -> None:
    assert list(bench.claims(_result(19.5, 100.0, 0.15)).values()) == [True, True, True]
    assert list(bench.claims(_result(19.3, 101.0, 0.16)).values()) == [False, False, False]
    assert list(bench.claims(_result(19.5, 100.0, None)).values())[2] is None
