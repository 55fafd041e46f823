"""Coordinated omission: a 0.5 s device stall must show in the open-loop p99.

The simulated device (5 ms per request, no jitter) pauses for 0.5 s in the middle of a single
4 s measurement window at a constant 40 req/s. Open loop keeps sending on schedule and times each
request from its intended send time, so the ~20 requests scheduled during the stall carry
0-500 ms of waiting: p99 must be close to the stall. A closed-loop user just waits out the stall
once; its p99 stays near the service time (only the maximum sees the stall), and the result
says that closed loop is prone to coordinated omission.
"""

from __future__ import annotations

import pytest

from tests.load.driver import run_driver

pytestmark = pytest.mark.usefixtures("spawns", "quiet_machine")

STALL_S = 0.5
DEVICE_MS = 5.0


def test_open_loop_p99_shows_the_stall_closed_loop_does_not() -> None:
    one_window = {"warmup_s": 0.5, "window_s": 4.0, "max_windows": 1, "stable_windows": 1}
    answer = run_driver(
        {
            "model": {"name": "stall", "device_ms": DEVICE_MS},
            "levels": [
                {
                    "mode": "request_rate",
                    "target": 40,
                    "arrival": "constant",
                    "pause_after_s": 2.0,
                    "pause_s": STALL_S,
                    **one_window,
                },
                {
                    "mode": "concurrency",
                    "target": 1,
                    "pause_after_s": 2.0,
                    "pause_s": STALL_S,
                    **one_window,
                },
            ],
        }
    )
    open_loop, closed_loop = answer["levels"]

    # Open loop: every scheduled request was sent, and the stall dominates the tail.
    assert open_loop["request_count"] == pytest.approx(40 * 4.0, rel=0.1)
    assert open_loop["p99_ms"] >= 0.8 * STALL_S * 1000, open_loop
    assert open_loop["p90_ms"] >= 0.2 * STALL_S * 1000, open_loop
    # the server itself was fast: the service time of most requests stayed small
    assert open_loop["service_p50_ms"] < DEVICE_MS + 10
    assert open_loop["send_lag_p99_ms"] < 50  # the generator kept its schedule during the stall

    # Closed loop: one request waited out the stall; p99 hides it (coordinated omission).
    assert closed_loop["max_ms"] >= 0.8 * STALL_S * 1000
    assert closed_loop["p99_ms"] < 0.2 * STALL_S * 1000, closed_loop
    assert closed_loop["latency_basis"] == "actual_send"
    assert any("coordinated omission" in msg for msg in closed_loop["messages"])
    assert not any("coordinated omission" in msg for msg in open_loop["messages"])


def test_a_full_pool_delays_requests_but_never_drops_them() -> None:
    """One request slot per process: bursts queue in the backlog, timed from the intended send."""
    answer = run_driver(
        {
            "model": {"name": "pool", "device_ms": 10.0},
            "pool_size": 1,
            "levels": [
                {
                    "mode": "request_rate",
                    "target": 60,
                    "arrival": "poisson",
                    "warmup_s": 0.3,
                    "window_s": 3.0,
                    "max_windows": 1,
                    "stable_windows": 1,
                }
            ],
        }
    )
    (m,) = answer["levels"]
    assert any("pool (1 in flight per process) was full" in msg for msg in m["messages"])
    assert m["max_in_flight"] >= 2  # the backlog counts as in flight
    # every scheduled request was sent and answered (Poisson count: 180 +- 3 sigma)
    assert abs(m["request_count"] - 60 * m["duration_s"]) <= 3 * (60 * m["duration_s"]) ** 0.5 + 5
    assert m["error_count"] == 0
    # waiting for the slot is part of the latency, not of the service time
    assert m["p99_ms"] > m["service_p99_ms"] + 5


def test_failures_are_counted_by_kind_not_hidden() -> None:
    """The model disappears mid-level: every later request fails, and the result says how."""
    answer = run_driver(
        {
            "model": {"name": "gone", "device_ms": 2.0},
            "levels": [
                {
                    "mode": "request_rate",
                    "target": 50,
                    "arrival": "constant",
                    "warmup_s": 0.3,
                    "window_s": 3.0,
                    "max_windows": 1,
                    "stable_windows": 1,
                    "unload_after_s": 1.8,
                }
            ],
        }
    )
    (m,) = answer["levels"]
    assert m["request_count"] == pytest.approx(150, rel=0.1)  # failed requests still count
    assert 0.3 * m["request_count"] < m["error_count"] < 0.9 * m["request_count"]
    assert m["errors"] and all(kind.startswith("HTTP ") for kind in m["errors"])
    assert sum(m["errors"].values()) == m["error_count"]
    assert any("failed requests" in msg for msg in m["messages"])
    # throughput counts successes only
    assert m["throughput_rps"] * m["duration_s"] == pytest.approx(
        m["request_count"] - m["error_count"], abs=1
    )
