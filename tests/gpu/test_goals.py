"""The GPU memory goal: a config above it, or measured without GPU metrics, misses the goals."""

from __future__ import annotations

import math

from analyzer.config.knobs import Knobs
from analyzer.config.scenario import Scenario
from analyzer.evaluation import Evaluator, peak_gpu_memory_mb
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.goals import goals_met
from analyzer.measure.measurement import GpuStats, Measurement, ServerView
from analyzer.measure.specs import Goals, LoadMode
from analyzer.rundir.measurements import CapacityMeasurement
from analyzer.rundir.summary import ConfigEntry, server_gpus


class NoLoad:
    def measure(self, spec):  # type: ignore[no-untyped-def]
        raise AssertionError("not measured here")

    def find_capacity(self, spec):  # type: ignore[no-untyped-def]
        raise AssertionError("not measured here")


def numbers(peak_mb: float) -> dict[str, float]:
    return {
        "throughput_rps": 100.0,
        "offered_rps": 100.0,
        "p50_ms": 5.0,
        "p90_ms": 8.0,
        "p99_ms": 10.0,
        "error_rate": 0.0,
        "gpu_memory_peak_mb": peak_mb,
    }


def test_memory_goal_slack() -> None:
    scenario = Scenario.model_validate({"goals": {"p99_ms": 100, "max_gpu_memory_mb": 1000}})
    ev = Evaluator(scenario, NoLoad())
    fits = ev.constraints(numbers(800.0))
    assert fits["gpu_memory_slack"] == -0.2 and goals_met(None, fits)
    over = ev.constraints(numbers(1200.0))
    assert over["gpu_memory_slack"] == 0.2 and not goals_met(None, over)
    unknown = ev.constraints(numbers(math.nan))
    assert unknown["gpu_memory_slack"] == 1.0 and not goals_met(None, unknown)


def test_no_memory_goal_no_slack_and_same_hash() -> None:
    plain = Scenario.model_validate({})
    ev = Evaluator(plain, NoLoad())
    assert "gpu_memory_slack" not in ev.constraints(numbers(5000.0))
    # An unset goal leaves the fingerprint of older scenarios alone.
    data = plain.to_dict()
    assert "max_gpu_memory_mb" in data["goals"]
    with_goal = Scenario.model_validate({"goals": {"max_gpu_memory_mb": 1000}})
    assert with_goal.hash() != plain.hash()


def _measurement(gpus: tuple[GpuStats, ...]) -> Measurement:
    return Measurement(
        mode=LoadMode.REQUEST_RATE,
        target=10.0,
        throughput_rps=10.0,
        p50_ms=1.0,
        p90_ms=1.0,
        p95_ms=1.0,
        p99_ms=1.0,
        request_count=100,
        error_count=0,
        stable=True,
        valid=True,
        send_lag_p99_ms=0.0,
        server=ServerView(gpus=gpus),
    )


def test_operating_point_figures_reach_the_summary_entry() -> None:
    a = GpuStats("GPU-a", "sim", 60.0, 70.0, (50.0, 70.0), 480.0, 16384.0, 46.0, 70.0)
    b = GpuStats("GPU-b", None, 10.0, 10.0, (10.0,), 900.0, 16384.0, None, None)
    m = _measurement((a, b))
    assert peak_gpu_memory_mb(m) == 900.0
    assert math.isnan(peak_gpu_memory_mb(_measurement(())))
    figures = CapacityMeasurement(CapacityResult(Goals(10.0), 10.0, (m,), m, True)).gpu_figures()
    assert figures is not None and [g["uuid"] for g in figures] == ["GPU-a", "GPU-b"]
    assert figures[0]["utilization_pct_mean"] == 60.0 and figures[0]["power_mean_w"] == 46.0
    nothing = CapacityResult(Goals(10.0), 0.0, (_measurement(()),), None, False)
    assert CapacityMeasurement(nothing).gpu_figures() is None

    def entry(gpus: list[dict[str, object]]) -> ConfigEntry:
        return ConfigEntry(Knobs(8), 10.0, 1.0, 1.0, True, 0, gpus=tuple(gpus))

    assert server_gpus(entry(figures), entry(figures[:1]), None) == [
        {"uuid": "GPU-a", "name": "sim", "memory_total_mb": 16384.0},
        {"uuid": "GPU-b", "name": None, "memory_total_mb": 16384.0},
    ]
