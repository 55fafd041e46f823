"""A server's batch-size histogram beside the simulator's (the probe test and
``benchmarks/simulator_vs_server.py``): each histogram maps a batch size to its executions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def batch_counts(model_stats: Mapping[str, Any]) -> dict[int, int]:
    """Executions by batch size from one model's statistics (``model_stats[i]`` of the
    statistics extension: its ``batch_stats``)."""
    return {
        int(b["batch_size"]): int(b["compute_infer"]["count"])
        for b in model_stats.get("batch_stats", ())
    }


def shares(hist: Mapping[int, int]) -> dict[int, float]:
    """Each batch size's share of the executions."""
    total = sum(hist.values())
    return {b: n / total for b, n in hist.items()}


def tv_distance(a: Mapping[int, int], b: Mapping[int, int]) -> float:
    """Total-variation distance between two histograms' shares (0: alike, 1: disjoint)."""
    sa, sb = shares(a), shares(b)
    return 0.5 * sum(abs(sa.get(k, 0.0) - sb.get(k, 0.0)) for k in set(sa) | set(sb))


def mean_batch(hist: Mapping[int, int]) -> float:
    """Mean batch size over the executions."""
    return sum(b * n for b, n in hist.items()) / sum(hist.values())
