"""The recorder keeps reported latencies in completion order, as the sequential rule needs."""

from __future__ import annotations

import msgpack
import pytest

from analyzer.load.recorder import Recorder, Tick


def _recorder(latencies_s: list[float]) -> Recorder:
    rec = Recorder()
    for latency in latencies_s:
        rec.dispatched_one(0.0)
        rec.done(latency, latency, None)
    return rec


def test_ticks_carry_latencies_in_completion_order_across_processes_and_intervals() -> None:
    first, second = _recorder([0.030, 0.010, 0.020]), _recorder([0.005])
    # The wire format (Locust messages are msgpack) keeps the sequence as bytes.
    wire = [msgpack.unpackb(msgpack.packb(r.take_tick())) for r in (first, second)]
    merged = Tick.merge(wire)
    assert list(merged.sequence) == pytest.approx([30.0, 10.0, 20.0, 5.0], rel=1e-6)
    local = _recorder([0.001, 0.002]).take_local_tick()
    merged.add(local)
    assert list(merged.sequence)[-2:] == pytest.approx([1.0, 2.0], rel=1e-6)
    assert merged.completed == 6 and len(merged.sequence) == merged.completed
    assert len(first.take_local_tick().sequence) == 0  # taken: the next tick starts empty
