"""The load side of a priority mix without a server: the class draw, per-class recording and
ticks merged across processes, and the engine options a scenario's classes make."""

from __future__ import annotations

from collections import Counter

from analyzer.config.scenario import load_scenario
from analyzer.load.classes import ClassDraw, RequestClass, request_classes
from analyzer.load.engine import engine_options
from analyzer.load.recorder import Recorder, Tick
from analyzer.measure.histograms import percentiles_us

MIX = (RequestClass("urgent", 0.2, priority=1), RequestClass("bulk", 0.8, timeout_us=5000))


def test_the_draw_follows_the_shares_and_is_seeded() -> None:
    draw = ClassDraw(MIX, seed=11)
    drawn = [draw() for _ in range(20_000)]
    counts = Counter(drawn)
    assert set(counts) == {0, 1}
    assert abs(counts[0] / len(drawn) - 0.2) < 0.01
    again = ClassDraw(MIX, seed=11)
    assert [again() for _ in range(20_000)] == drawn
    other = ClassDraw(MIX, seed=12)
    assert [other() for _ in range(200)] != drawn[:200]
    assert {ClassDraw((), seed=1)() for _ in range(10)} == {0}  # no mix: one implicit class


def test_request_parameters_are_sent_only_when_set() -> None:
    assert MIX[0].infer_kwargs() == {"priority": 1}
    assert MIX[1].infer_kwargs() == {"timeout": 5000}
    assert RequestClass("plain").infer_kwargs() == {}
    assert RequestClass.from_dict(MIX[1].to_dict()) == MIX[1]


def test_scenario_classes_reach_the_engine_options() -> None:
    scenario = load_scenario(
        None,
        {
            "traffic.classes": [
                {"name": "urgent", "share": 0.25, "priority": 1, "p99_ms": 50},
                {"name": "bulk", "share": 0.75, "timeout_us": 2000},
            ]
        },
        env={},
    )
    options = engine_options(scenario, "http://127.0.0.1:8000", "m")
    assert options.classes == request_classes(scenario.traffic)
    assert options.classes == (
        RequestClass("urgent", 0.25, priority=1),
        RequestClass("bulk", 0.75, timeout_us=2000),
    )
    assert engine_options(load_scenario(None, {}, env={}), "127.0.0.1:8000", "m").classes == ()


def _recorder(fast_ms: float, slow_ms: float) -> Recorder:
    """10 urgent requests at ``fast_ms``, 30 bulk at ``slow_ms`` of which 3 failed."""
    rec = Recorder(classes=2)
    for _ in range(10):
        rec.dispatched_one(0.0)
        rec.done(fast_ms / 1e3, fast_ms / 1e3, None, 0)
    for i in range(30):
        rec.dispatched_one(0.0)
        rec.done(
            slow_ms / 1e3, slow_ms / 1e3, "HTTP 503: Request timeout expired" if i < 3 else None, 1
        )
    return rec  # fmt: skip


def test_per_class_counts_and_latencies_survive_the_wire_and_the_merge() -> None:
    a, b = _recorder(5.0, 100.0), _recorder(7.0, 300.0)
    merged = Tick.merge([a.take_tick(), b.take_tick()])
    assert merged.completed == 80 and merged.errors == 6
    urgent, bulk = merged.classes
    assert (urgent.completed, urgent.errors, bulk.completed, bulk.errors) == (20, 0, 60, 6)
    assert percentiles_us(urgent.latency, [100])[100] < 7_100
    assert percentiles_us(bulk.latency, [50])[50] > 99_000
    # A later interval adds to the earlier one; a local tick (no encoding) carries them too.
    local = _recorder(5.0, 100.0).take_local_tick()
    merged.add(local)
    assert [c.completed for c in merged.classes] == [30, 90]
    assert [c.errors for c in merged.classes] == [0, 9]


def test_without_classes_nothing_is_tallied_per_class() -> None:
    rec = Recorder()
    rec.dispatched_one(0.0)
    rec.done(0.01, 0.01, None, 0)
    tick = rec.take_tick()
    assert tick["classes"] == []
    merged = Tick.merge([tick])
    assert merged.classes == [] and merged.completed == 1
    # A tick from a process that predates classes merges as one without them.
    del tick["classes"]
    assert Tick.merge([tick]).classes == []
