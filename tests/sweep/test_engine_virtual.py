"""``perfsweep run --search predict`` on a generative model in virtual time: the bundled
``tinyllm`` on its simulated engine, each level simulated by the engine simulator on the load's
lengths. The predict phase simulates every config, the sweep measures the predicted best first
and stops when the measurement agrees; what it measures is the same engine, so the predictions
must be right within the simulator's sampling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.rundir.results import load_summary
from tests.support.sweeps import virtual_sweep

pytestmark = [pytest.mark.usefixtures("takes_seconds")]

SCENARIO = """
objective = "throughput"

[model]
name = "tinyllm"
device = "sim"
protocol = "generate-stream"

[traffic]
mode = "rate"
input_tokens = "64"
output_tokens = "16"
min_rate_rps = 1.0
start_rps = 8.0
max_rate_rps = 200.0

[goals]
ttft_p99_ms = 150.0
itl_p99_ms = 20.0
max_error_rate = 0.01

[space]
max_num_seqs = [1, 4, 16]
max_num_batched_tokens = [2048]

[budget]
trials = 3
time_budget_s = 100000
patience = 3
warmup_s = 0.5
window_s = 2.0
capacity_resolution = 0.1
validate_top = 1
validate_repeats = 1

[search]
strategy = "predict"
"""


def test_predict_measures_the_predicted_best_engine_config_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "tinyllm.toml"
    scenario.write_text(SCENARIO)
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *("--scenario", str(scenario), "--run-dir", str(run_dir)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    predictions = json.loads((run_dir / "predictions.json").read_text())
    profile = predictions["profile"]
    # The profile phase of a virtual engine is its own costs, calibrated on the measured
    # baseline (a jittered sample of the same engine: within a few percent).
    assert profile["source"] == "toml:tinyllm_sim"
    assert profile["engine"]["fixed_ms"] == pytest.approx(10.0, rel=0.05)
    caps = {c["config"]["max_num_seqs"]: c["capacity_rps"] for c in predictions["configs"]}
    assert set(caps) == {1, 4, 16}
    # Decoding together pays until the ITL goal binds: 16 sequences serve the most.
    assert caps[1] < caps[4] < caps[16]
    summary = load_summary(run_dir)
    first = json.loads((run_dir / "trials" / "000" / "measurement.json").read_text())
    assert first["config"]["max_num_seqs"] == 16  # the predicted best, measured first
    measured = first["throughput_rps"]
    assert measured == pytest.approx(caps[16], rel=0.15)
    assert summary["best"]["meets_goals"]
    assert summary["best"]["config"]["max_num_seqs"] == 16
    assert summary["stop_reason"] == "prediction"
    assert not list(tmp_path.glob("perfsweep-virtual-*"))
