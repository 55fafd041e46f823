"""Accuracy against a simulated device with a known, jitter-free latency (HTTP and gRPC).

The model sleeps exactly ``DEVICE_MS`` per execution (no batching, one instance). Requests arrive
on a constant schedule at no more than half the device's capacity, so none ever queues behind
another: every request's true latency is the device time plus the server's and client's fixed
overheads (~2-3 ms here: the reference server's Python request path, loopback, gevent's ~1 ms
timer bias). Stated tolerance: p50 in [DEVICE_MS, DEVICE_MS + 8 ms], p90 within + 15 ms, p99
within + 60 ms. The p99 allowance is wide on purpose: the suite runs on a shared 2-core machine
(load average 4-5 while other suites run), where a p99 over 45-75 samples is decided by one or
two OS scheduling stalls. No percentile may fall below the device time (that would mean the
clock started late). Throughput is within 10 % of the target, and the server's own
compute_infer time is within 10 % of the device time.
"""

from __future__ import annotations

import pytest

from tests.load.driver import run_driver

pytestmark = pytest.mark.usefixtures("spawns", "quiet_machine")

DEVICE_MS = 20.0
OVERHEAD_P50_MS = 8.0
OVERHEAD_P90_MS = 15.0
OVERHEAD_P99_MS = 60.0
RATES = (15.0, 25.0)


def _levels() -> list[dict]:
    common = {"arrival": "constant", "warmup_s": 0.5, "window_s": 1.0, "max_windows": 3}
    levels = [{"mode": "request_rate", "target": r, **common} for r in RATES]
    levels.append({"mode": "concurrency", "target": 1, **common})
    return levels


def _brief(m: dict) -> str:
    keys = (
        "mode",
        "target",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "service_p99_ms",
        "send_lag_p99_ms",
        "generator_cpu_pct",
        "request_count",
        "throughput_rps",
        "valid",
        "messages",
    )
    return ", ".join(f"{k}={m[k]}" for k in keys)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_latency_matches_the_simulated_device(protocol: str) -> None:
    answer = run_driver(
        {
            "model": {"name": "fixed20", "device_ms": DEVICE_MS},
            "protocol": protocol,
            "levels": _levels(),
            "retry_invalid": True,
        }
    )
    open_levels, closed = answer["levels"][:-1], answer["levels"][-1]
    for m in answer["levels"]:
        print(_brief(m))  # shown when an assertion fails
    for m, rate in zip(open_levels, RATES, strict=True):
        assert m["mode"] == "request_rate" and m["latency_basis"] == "intended_send"
        assert m["valid"], m["messages"]
        assert m["error_count"] == 0
        assert DEVICE_MS <= m["p50_ms"] <= DEVICE_MS + OVERHEAD_P50_MS, _brief(m)
        assert DEVICE_MS <= m["p90_ms"] <= DEVICE_MS + OVERHEAD_P90_MS, _brief(m)
        assert DEVICE_MS <= m["p99_ms"] <= DEVICE_MS + OVERHEAD_P99_MS, _brief(m)
        assert m["throughput_rps"] == pytest.approx(rate, rel=0.10), _brief(m)
        # 3 windows of 1.5 s at the rate (the last 3 windows are merged)
        assert m["request_count"] == pytest.approx(rate * m["duration_s"], rel=0.10)
        server = m["server"]
        assert server["compute_infer_us"] == pytest.approx(DEVICE_MS * 1000, rel=0.10)
        assert server["batch_sizes"] == {"1": server["execution_count"]}
        assert server["avg_batch_size"] == 1.0
        assert server["success_count"] == pytest.approx(m["request_count"], abs=6), _brief(m)
    # Closed loop, one user: back-to-back requests; throughput = 1 / latency.
    assert closed["latency_basis"] == "actual_send"
    assert DEVICE_MS <= closed["p50_ms"] <= DEVICE_MS + OVERHEAD_P50_MS, _brief(closed)
    assert closed["throughput_rps"] == pytest.approx(1000.0 / closed["mean_ms"], rel=0.10)
