"""``perfsweep load --find-capacity`` on a simulated model whose capacity is computable.

One instance, no dynamic batching, a jitter-free device of ``DEVICE_MS`` per execution: the
server completes at most ``1000 / DEVICE_MS`` requests per second, whatever the latency goal
(below that rate, constant arrivals never queue; above it the queue, and with it p99, grows
without bound). The search must land within 10 % of that capacity, and the JSON must carry
every point tried.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.load.refserver import REPO_ROOT, RefServer, write_sim_model

pytestmark = pytest.mark.usefixtures("spawns", "quiet_machine")

DEVICE_MS = 20.0
CAPACITY_RPS = 1000.0 / DEVICE_MS


@pytest.mark.slow
def test_find_capacity_lands_within_ten_percent(tmp_path: Path) -> None:
    write_sim_model(tmp_path / "repo", "cap", DEVICE_MS)
    out = tmp_path / "capacity.json"
    with RefServer(tmp_path / "repo", ("cap",)) as srv:
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "perfsweep"),
                "load",
                "--url",
                srv.http_url,
                "--model",
                "cap",
                "--metrics-url",
                srv.metrics_url,
                "--find-capacity",
                "--p99-ms",
                "200",
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
                "--output",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=400,
            cwd=REPO_ROOT,
        )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    doc = json.loads(out.read_text())
    assert doc["format_version"] == 1
    capacity = doc["capacity_rps"]
    assert CAPACITY_RPS * 0.9 <= capacity <= CAPACITY_RPS * 1.1, doc["capacity"]["message"]
    points = doc["capacity"]["points"]
    # an invalid step (generator starved by a busy machine) is measured again: dedupe
    targets = list(dict.fromkeys(p["target"] for p in points))
    assert targets[:3] == [10, 20, 40]  # bracketing doubles from the start rate
    assert capacity in targets
    for p in points:
        for key in (
            "mode",
            "target",
            "throughput_rps",
            "p50_ms",
            "p90_ms",
            "p95_ms",
            "p99_ms",
            "request_count",
            "error_count",
            "stable",
            "valid",
            "send_lag_p99_ms",
            "server",
        ):
            assert key in p
        passed = (
            p["valid"]
            and p["stopped_early"] is None
            and p["p99_ms"] <= 200
            and not p["error_count"]
        )
        if p["target"] > capacity and p["valid"]:
            assert not passed  # nothing above the answer met the goal
    best = doc["capacity"]["best"]
    assert best["p99_ms"] <= 200 and best["server"]["avg_batch_size"] == 1.0
    assert "capacity" in done.stdout  # the final message names the result
    print(json.dumps([(p["target"], p["p99_ms"], p["valid"], p["messages"]) for p in points]))
