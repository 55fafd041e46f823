"""The same ``perfsweep load`` against a real Triton (``tests/support/real_triton.py``).

A Python-backend model sleeps ``DELAY_MS`` per execution (one instance, no batching), so Triton
serves at most ``1e6 / service_us`` requests per second, where ``service_us`` is the time per
request Triton itself reports (compute input + infer + output: the sleep plus the Python stub's
overhead). The capacity search must land within 10 % of that. Real Triton here has rare 60-120 ms
outliers (``notes/real-triton.md``), hence a generous p99 goal and confirmed failures.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.load.refserver import REPO_ROOT
from tests.support.real_triton import RealTriton, sleep_model_config

DELAY_MS = 20.0


def _perfsweep(*args: str, timeout_s: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "perfsweep"), "load", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
    )


@pytest.mark.triton
@pytest.mark.slow
def test_find_capacity_on_real_triton(real_triton: RealTriton, tmp_path: Path) -> None:
    real_triton.add_model(
        sleep_model_config("ps_sleep20", max_batch_size=0, execute_delay_ms=DELAY_MS)
    )
    real_triton.load_model("ps_sleep20")
    out = tmp_path / "capacity.json"
    done = _perfsweep(
        "--url",
        real_triton.http_url,
        "--model",
        "ps_sleep20",
        "--metrics-url",
        real_triton.metrics_url,
        "--find-capacity",
        "--p99-ms",
        "250",
        "--arrival",
        "constant",
        "--start-rps",
        "10",
        "--window-s",
        "1.5",
        "--max-windows",
        "3",
        "--warmup-s",
        "0.5",
        "--confirm-failures",
        "--output",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json.loads(out.read_text())
    best = doc["capacity"]["best"]
    server = best["server"]
    service_us = (
        server["compute_input_us"] + server["compute_infer_us"] + server["compute_output_us"]
    )
    assert DELAY_MS * 1000 <= service_us <= DELAY_MS * 1000 * 1.5
    truth = 1e6 / service_us
    assert truth * 0.9 <= doc["capacity_rps"] <= truth * 1.1, (truth, doc["capacity"]["message"])


@pytest.mark.triton
def test_fixed_rate_over_grpc_on_real_triton(real_triton: RealTriton, tmp_path: Path) -> None:
    out = tmp_path / "grpc.json"
    done = _perfsweep(
        "--url",
        real_triton.grpc_url,
        "--protocol",
        "grpc",
        "--model",
        "identity",
        "--stats-url",
        real_triton.http_url,
        "--metrics-url",
        real_triton.metrics_url,
        "--request-rate",
        "50",
        "--arrival",
        "poisson",
        "--window-s",
        "1",
        "--max-windows",
        "3",
        "--warmup-s",
        "0.5",
        "--output",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (m,) = json.loads(out.read_text())["results"]
    assert m["protocol"] == "grpc" and m["error_count"] == 0
    assert m["request_count"] == pytest.approx(50 * m["duration_s"], rel=0.25)
    # Triton's own statistics saw the same requests, batched by its dynamic batcher
    assert m["server"]["success_count"] == pytest.approx(m["request_count"], abs=5)
    assert m["server"]["avg_batch_size"] >= 1.0
    assert sum(m["server"]["batch_sizes"].values()) == m["server"]["execution_count"]
