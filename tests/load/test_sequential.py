"""Sequential capacity steps through real Locust against the reference server.

One instance, no batching, a jitter-free simulated device of ``DEVICE_MS`` per execution, so the
server completes at most ``1000 / DEVICE_MS`` requests per second. Two one-rate searches, each
far from the goal:

* ``LOW_RPS``, a quarter of that: the latencies are the device time plus the reference server's
  and the generator's overheads, far below the goal. The step must PASS long before its cap of
  ``MAX_REQUESTS`` (``max_rps = start_rps``: the search ends there, unbracketed).
* ``HIGH_RPS``, twice that: the queue, and with it every latency, grows without bound. The step
  must FAIL at its first looks (or by the backlog guard), after a few hundred requests. A FAIL
  the test decided far beyond the goal stands at once; one the guard stopped is confirmed by one
  repeat (``confirm_failures``) before the search gives up (``min_rps = start_rps``: nothing
  below it is tried).

How many requests a PASS takes depends on how correlated the latencies are: about 530 effective
requests with none over the goal, times ``tau`` (2-4 on this shared 2-core machine at a quarter of
the capacity, more where the load average is high), so its bound is loose; a FAIL needs only the
first look's 200. Counts of requests are asserted, never wall-clock times.
"""

from __future__ import annotations

import json

import pytest

from tests.load.child import run_module

pytestmark = pytest.mark.usefixtures("spawns", "quiet_machine")

DEVICE_MS = 5.0
CAPACITY_RPS = 1000.0 / DEVICE_MS
LOW_RPS = 0.25 * CAPACITY_RPS
HIGH_RPS = 2.0 * CAPACITY_RPS
GOAL_MS = 200.0
MAX_REQUESTS = 20_000


def _search(rate: float) -> dict:
    return {
        "goals": {"p99_ms": GOAL_MS},
        "start_rps": rate,
        "max_rps": rate,
        "min_rps": rate,
        "confirm_failures": True,
        "step": {
            "mode": "request_rate",
            "target": 1.0,
            "arrival": "poisson",
            "warmup_s": 0.5,
            # Windows long enough that their cap never ends a step here: the test does.
            "window_s": 10.0,
            "max_windows": 12,
            "sequential": {"goal_ms": GOAL_MS, "max_requests": MAX_REQUESTS},
        },
    }


@pytest.mark.slow
def test_far_from_goal_steps_end_early_with_their_verdict_in_the_measurement() -> None:
    spec = {
        "model": {"name": "seq", "device_ms": DEVICE_MS},
        "searches": [_search(LOW_RPS), _search(HIGH_RPS)],
    }
    answer = run_module("tests.load.sequential_driver", stdin=json.dumps(spec), timeout_s=360)
    low, high = answer["searches"]
    brief = [
        (
            p["target"],
            p["request_count"],
            p["valid"],
            p["step"] and p["step"]["reason"],
            [m for m in p["messages"] if m.startswith("INVALID")],
        )
        for r in (low, high)
        for p in r["points"]
    ]
    for p in low["points"] + high["points"]:
        step = p["step"]
        assert step is not None and step["goal_ms"] == GOAL_MS, brief
        assert step["n"] == p["request_count"], brief  # the verdict rests on every request
        for key in ("over", "n_eff", "tau", "lower_share", "upper_share", "look", "reason"):
            assert key in step, brief
    passing = [p for p in low["points"] if p["valid"]]  # a starved generator is measured again
    assert passing, brief
    for p in passing:
        assert p["step"]["verdict"] == "pass", brief
        assert p["step"]["n"] < MAX_REQUESTS // 4 and p["step"]["upper_share"] < 0.01, brief
    assert low["capacity_rps"] == LOW_RPS and not low["bracketed"], low["message"]
    assert low["best"]["step"]["verdict"] == "pass" and low["at_boundary"] is False
    failing = [p for p in high["points"] if p["valid"]]
    first = failing[0]["step"]
    far = first["alpha_look"] > 0 and first["lower_share"] >= 2 * first["target_share"]
    # Far beyond the goal by the test: no repeat; stopped by a guard: confirmed by a repeat.
    assert len(failing) == 1 if far else len(failing) >= 2, brief
    for p in failing:
        assert p["step"]["verdict"] == "fail", brief
        assert p["step"]["n"] <= 1_000, brief  # a few hundred requests
    assert high["capacity_rps"] == 0.0 and high["best"] is None, high["message"]
    print(json.dumps(brief))
