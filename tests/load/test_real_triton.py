"""``perfsweep load`` against a real Triton (``tests/support/real_triton.py``): a fixed rate
over gRPC, as Triton's own statistics count it.

How close its capacity search lands to a real Triton's known capacity is measured in
``benchmarks/capacity_accuracy.py`` (``--case triton``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.load.refserver import REPO_ROOT
from tests.support.real_triton import RealTriton


def _perfsweep(*args: str, timeout_s: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "perfsweep"), "load", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
    )


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
