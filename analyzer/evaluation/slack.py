"""The slacks: a trial's numbers against the goals, as continuous constraints (pure).

Every slack is <= 0 when satisfied and grows with the miss, so the sampler learns how far a
config is from feasible, not only that it is not. The keys are the same for every trial of a
run (Optuna compares them across trials)::

    p99_slack          (p99 - goal) / goal            an unmeasured p99 counts as 100x the goal
    err_slack          error rate - allowed rate
    throughput_slack   (required - reached) / required, -1 when nothing is required; the
                       objective says what is required (Objective.required_throughput)
    gpu_memory_slack   (peak - limit) / limit, only with goals.max_gpu_memory_mb; 1.0 when no
                       GPU memory was measured (a goal that cannot be checked is not met)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from analyzer.config.objective import Objective
from analyzer.config.sections import GoalsSection
from analyzer.config.traffic import TrafficMode, TrafficSection


def slacks(
    numbers: Mapping[str, float],
    goals: GoalsSection,
    traffic: TrafficSection,
    objective: Objective,
) -> dict[str, float]:
    """The constraints of one trial (see the module docstring).

    Args:
        numbers: ``throughput_rps``, ``offered_rps``, ``p99_ms``, ``error_rate`` and, when a
            GPU memory goal is set, ``gpu_memory_peak_mb`` (NaN: not measured).
        goals: The scenario's goals.
        traffic: The scenario's traffic (open or closed loop, the lowest rate).
        objective: What the trial is measured for.
    """
    p99 = numbers["p99_ms"] if math.isfinite(numbers["p99_ms"]) else 100 * goals.p99_ms
    required = objective.required_throughput(
        numbers,
        goals.min_throughput_rps,
        open_loop=traffic.mode is TrafficMode.RATE,
        min_rate_rps=traffic.min_rate_rps,
    )
    throughput_slack = (required - numbers["throughput_rps"]) / required if required > 0 else -1.0
    out = {
        "p99_slack": round((p99 - goals.p99_ms) / goals.p99_ms, 6),
        "err_slack": round(numbers["error_rate"] - goals.max_error_rate, 6),
        "throughput_slack": round(throughput_slack, 6),
    }
    if goals.max_gpu_memory_mb is not None:
        peak = numbers.get("gpu_memory_peak_mb", math.nan)
        out["gpu_memory_slack"] = (
            round((peak - goals.max_gpu_memory_mb) / goals.max_gpu_memory_mb, 6)
            if math.isfinite(peak)
            else 1.0
        )
    return out
