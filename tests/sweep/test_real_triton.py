"""`perfsweep run --url` tunes a Python-backend model on a real Triton, and the
best/config.pbtxt it writes loads on that Triton unchanged (as the model's config file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.results import load_summary, parse_config_text
from analyzer.search import Knobs
from analyzer.sweep import knobs_of
from tests.support.real_triton import RealTriton, sleep_model_config

pytestmark = [pytest.mark.triton, pytest.mark.slow]

MODEL = "sweep_sleep"

SCENARIO = """
objective = "throughput"
[traffic]
min_rate_rps = 5.0
start_rps = 40.0
max_rate_rps = 400.0
[goals]
p99_ms = 300.0
max_error_rate = 0.01
[space]
max_batch_size = [1, 8]
max_queue_delay_us = [0, 2000]
delay_steps = 2
instance_count = [1, 2]
[budget]
trials = 2
warmup_s = 0.5
window_s = 0.5
min_requests = 60
capacity_resolution = 0.3
validate_top = 1
validate_repeats = 1
validate_window_factor = 1.0
"""


def test_sweep_a_real_triton_and_load_the_best_config(
    real_triton: RealTriton, tmp_path: Path
) -> None:
    real_triton.add_model(
        sleep_model_config(
            MODEL, max_batch_size=8, execute_delay_ms=4.0, execute_delay_ms_per_item=0.5
        )
    )
    real_triton.load_model(MODEL)
    scenario = tmp_path / "s.toml"
    scenario.write_text(SCENARIO)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from analyzer.cli import main; main()",
            "run",
            "--scenario",
            str(scenario),
            "--url",
            f"http://{real_triton.http_url}",
            "--model",
            MODEL,
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["device"] == "remote" and summary["trials"]["total"] == 2
    assert summary["environment"]["target"]["server"] == "triton"
    assert summary["baseline"]["config"]["dynamic_batching"] is False
    best_path = run_dir / "best" / "config.pbtxt"
    assert summary["best"] is not None, done.stdout[-3000:]
    best = parse_config_text(best_path.read_text())

    # Drop the file in as the model's own config.pbtxt and load it without any override.
    (real_triton.repository / MODEL / "config.pbtxt").write_text(best_path.read_text())
    real_triton.load_model(MODEL)
    status, payload = real_triton.http_status("GET", f"/v2/models/{MODEL}/config")
    assert status == 200
    served = json_format.Parse(payload, mc.ModelConfig(), ignore_unknown_fields=True)
    assert knobs_of(served) == knobs_of(best) == Knobs.from_dict(summary["best"]["config"])
    assert (
        served.parameters["execute_delay_ms"].string_value
        == best.parameters["execute_delay_ms"].string_value
    )
