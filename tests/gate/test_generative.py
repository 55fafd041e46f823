"""``perfsweep gate`` on a generative model: the real command measuring the reference engine's
``tinyllm`` over OpenAI's streaming protocol, then judging its own output as a baseline.

Verdicts that depend on the machine's speed are planted out of reach: the latency goals are a
minute (always met), the tokens/s floor a million (never met).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gate.test_e2e import junit_cases, perfsweep

pytestmark = [pytest.mark.usefixtures("spawns"), pytest.mark.slow]

OUTPUT_TOKENS = 8


def test_gate_measures_token_streams_and_judges_them_against_a_baseline(tmp_path: Path) -> None:
    measured = perfsweep(
        "gate", "--model", "tinyllm", "--device", "sim", "--protocol", "openai",
        "--input-tokens", "16", "--output-tokens", str(OUTPUT_TOKENS),
        "--rate-rps", "2", "--warmup-s", "0.5", "--window-s", "1", "--windows", "2",
        "--repeats", "2",
        "--ttft-p99-ms", "60000", "--itl-p99-ms", "60000", "--min-tokens-per-s", "1000000",
        "--output", str(tmp_path / "result.json"), "--junit", str(tmp_path / "measured.xml"),
        cwd=tmp_path,
    )  # fmt: skip
    assert measured.returncode == 1, measured.stdout + measured.stderr
    assert "TTFT p99" in measured.stdout and "tok/s" in measured.stdout  # each repeat's line
    assert junit_cases(tmp_path / "measured.xml") == {
        "ttft_p99_ms <= 60000": False,
        "itl_p99_ms <= 60000": False,
        "tokens_per_s >= 1e+06": True,
    }
    doc = json.loads((tmp_path / "result.json").read_text())
    assert doc["environment"]["requests"]["output_tokens"] == str(OUTPUT_TOKENS)
    assert doc["environment"]["protocol"] == "openai"
    assert len(doc["results"]) == 2
    for level in doc["results"]:
        tokens = level["tokens"]
        assert tokens["streams"] > 0 and tokens["failed_streams"] == 0
        # Each stream generated exactly its output length (ignore_eos, the server's usage).
        assert tokens["output_tokens"] == OUTPUT_TOKENS * tokens["streams"]
        assert tokens["ttft_p99_ms"] > 0 and tokens["itl_p99_ms"] > 0

    # The same result against itself as the baseline: every figure, tokens included, unchanged.
    judged = perfsweep(
        "gate", str(tmp_path / "result.json"), "--baseline", str(tmp_path / "result.json"),
        "--max-regression", "10%", "--junit", str(tmp_path / "judged.xml"), cwd=tmp_path,
    )  # fmt: skip
    assert judged.returncode == 0, judged.stdout + judged.stderr
    assert junit_cases(tmp_path / "judged.xml") == {
        f"{name} regression <= 10%": False
        for name in ("throughput_rps", "p99_ms", "ttft_p99_ms", "itl_p99_ms", "tokens_per_s")
    }
