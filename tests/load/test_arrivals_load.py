"""Arrival processes through the real generator: what was sent is what was asked.

The reference server serves a fast simulated model (0.2 ms a batch, batching up to 32), so the
server never holds the generator back; each level records its process, the CV of the gaps between
the requests actually sent (all generator processes together), and the share sent more than 1 ms
after their intended time.
"""

from __future__ import annotations

import itertools

import pytest

from analyzer.measure.arrivals import Trace, fit_gaps, parse_arrival
from tests.load.driver import run_driver

pytestmark = pytest.mark.usefixtures("spawns", "quiet_machine")

FAST_MODEL = {
    "name": "fast",
    "device_ms": 0.2,
    "per_item_ms": 0.01,
    "max_batch_size": 32,
    "dynamic_batching": "dynamic_batching { }",
}
ONE_WINDOW = {"warmup_s": 0.5, "window_s": 5.0, "max_windows": 1, "stable_windows": 1}


def _level(arrival: object, target: float) -> dict[str, object]:
    return {"mode": "request_rate", "target": target, "arrival": arrival, **ONE_WINDOW}


def test_a_trace_is_replayed_as_recorded_at_500_rps() -> None:
    # A bursty recording: 4,000 sends of an on/off process at 500 req/s (bursts at 1,000 req/s).
    process = parse_arrival("mmpp:2@0.5,0.5@1")
    gaps = tuple(itertools.islice(process.gaps(500.0, 11), 4000))
    trace = parse_arrival("trace", Trace(gaps, "recorded.csv"))
    recorded = fit_gaps(gaps)
    # Measured beside a bare timer ticking at the same rate: how late this host wakes anything.
    level = _level(trace.to_dict(), 500.0) | {"host_timer": True}
    (level,) = run_driver({"model": FAST_MODEL, "levels": [level]})["levels"]
    host = level["host_late_share_1ms"]
    print(
        f"replayed {level['request_count']} requests: late share (> 1 ms) "
        f"{level['late_share_1ms']:.4f} (a bare timer beside it: {host:.4f}), send lag p99 "
        f"{level['send_lag_p99_ms']:.2f} ms, gap CV {level['send_gap_cv']:.2f} "
        f"(recorded {recorded.cv:.2f})"
    )
    assert level["arrival"] == "trace:recorded.csv"
    assert level["error_count"] == 0
    assert level["offered_rps"] == pytest.approx(500.0, rel=0.2)  # 5 s of a bursty stretch
    # A late send moves the two gaps beside it: the shape holds within what lateness moved.
    late = level["late_share_1ms"]
    assert level["send_gap_cv"] == pytest.approx(recorded.cv, rel=0.15 + late)
    # Within a millisecond, where the host lets anything be. On a quiet host (the bare timer
    # 0.2-0.7 % late) 0.5-3.0 % of the sends were more than 1 ms late: the server works in the
    # same bursts on the same 2 cores, which the idle timer never feels. gevent's millisecond
    # timers in place of the timerfd sent 16-23 % late: the bound below still fails that. A busy
    # host does not share its lateness fairly: the scheduler favours a process that mostly
    # sleeps (the timer) over two that work in the same bursts; with one busy loop beside them
    # the timer read 9-15 % and the sends 57-62 %, in CI's suite 2.7 % against 15.6 %. There
    # only the generator's own lag rule (10 ms) is judged.
    if host > 0.01:
        invalid = [m for m in level["messages"] if m.startswith("INVALID")]
        assert all("generator was saturated" in m for m in invalid), level
        return
    assert level["valid"], level["messages"]
    assert late <= 2.0 * host + 0.05, level


def _asked_cv(text: str, rate: float, window: dict[str, float]) -> float:
    """The CV of the gaps the level's stream (seed 0) asks for in its measured window."""
    times = parse_arrival(text).send_times(rate, 0)
    start, end = window["warmup_s"], window["warmup_s"] + window["window_s"]
    sends = list(itertools.takewhile(lambda t: t < end, (t for t in times if t >= start)))
    return fit_gaps([b - a for a, b in itertools.pairwise(sends)]).cv


def test_each_process_sends_its_own_shape() -> None:
    # 50 req/s: gaps of 20 ms on average, so the dispatcher's wake-up jitter (a millisecond on a
    # busy machine: a CV of 0.2 at 5 ms gaps) leaves the shape of what is sent as it was asked.
    shapes = ("constant", "poisson", "gamma:cv=2", "mmpp:4@0.5,0.25@2")
    # 200 sends show a renewal shape; the modulated one needs several of its 2 s sojourns.
    windows = {
        s: {"warmup_s": 0.5, "window_s": 8.0 if s.startswith("mmpp") else 4.0}
        | {"max_windows": 1, "stable_windows": 1}
        for s in shapes
    }
    levels = [{"mode": "request_rate", "target": 50.0, "arrival": s, **windows[s]} for s in shapes]
    answer = run_driver({"model": FAST_MODEL, "levels": levels})
    for text, level in zip(shapes, answer["levels"], strict=True):
        assert level["arrival"] == text
        assert level["valid"], level["messages"]  # the generator kept up (the lag rule)
        # What was sent is what the stream asked for in that window (its edges, which the
        # level's start decides to a few tens of ms, and the send lag apart).
        asked = _asked_cv(text, 50.0, windows[text])
        assert level["send_gap_cv"] == pytest.approx(asked, abs=0.1), text
    constant, poisson, _, mmpp = answer["levels"]
    assert constant["send_gap_cv"] < 0.1
    assert mmpp["send_gap_cv"] > poisson["send_gap_cv"] + 0.2
    for level in (constant, poisson):
        assert level["offered_rps"] == pytest.approx(50.0, rel=0.15)


def test_two_generator_processes_send_one_stream() -> None:
    """Each process sends every other request of the one stream: constant arrivals stay
    evenly spaced across both, where two streams of their own would interleave at random."""
    answer = run_driver({"model": FAST_MODEL, "workers": 2, "levels": [_level("constant", 200.0)]})
    (level,) = answer["levels"]
    assert level["valid"], level["messages"]
    assert level["workers"] == 2
    assert level["offered_rps"] == pytest.approx(200.0, rel=0.1)
    # Two independent constant streams at random phases give gaps of CV ~0.6 and up.
    assert level["send_gap_cv"] < 0.3, level
