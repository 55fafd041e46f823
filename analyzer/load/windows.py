"""A level's measurement windows from the controller's ticks.

``_Window`` accumulates the ticks of one window; ``_equal_parts`` cuts a level's ticks into
equal windows; ``_feed`` hands a tick to a sequential level's rule (decided on gevent's thread
pool, so the hub keeps sending meanwhile).
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
from array import array
from dataclasses import dataclass, field

import gevent
import numpy as np

from analyzer.load.recorder import Tick
from analyzer.measure.measurement import WindowStats
from analyzer.measure.stepping import SequentialRule, StepRecord
from analyzer.target.server_stats import ServerSnapshot


@dataclass
class _Window:
    """A window being filled."""

    started: float
    tick: Tick = field(default_factory=Tick)
    server_before: ServerSnapshot | None = None


@dataclass(frozen=True)
class _TickSample:
    """What the stability check of a sequential step keeps of one tick (not its histograms:
    three HDR histograms are ~0.4 MB, ten a second)."""

    at_s: float
    completed: int
    errors: int
    sequence: array[float]


def _equal_parts(samples: list[_TickSample], parts: int) -> list[WindowStats]:
    """A step's ticks cut into ``parts`` consecutive stretches of about equal length, as windows
    for the stability check (throughput and p99 only)."""
    if not samples or parts < 1:
        return []
    total_s = samples[-1].at_s
    out: list[WindowStats] = []
    start_s, index = 0.0, 0
    for part in range(parts):
        end_s = total_s * (part + 1) / parts
        completed = errors = 0
        latencies: list[np.ndarray] = []
        while index < len(samples) and (samples[index].at_s <= end_s or part == parts - 1):
            tick = samples[index]
            completed, errors = completed + tick.completed, errors + tick.errors
            latencies.append(np.asarray(tick.sequence, dtype=float))
            index += 1
        duration = end_s - start_s
        lat = np.sort(np.concatenate(latencies)) if latencies else np.empty(0)
        p99 = float(lat[max(int(0.99 * lat.size + 0.5), 1) - 1]) if lat.size else 0.0
        out.append(
            WindowStats(
                index=part,
                duration_s=duration,
                request_count=completed,
                error_count=errors,
                throughput_rps=(completed - errors) / duration if duration > 0 else 0.0,
                p50_ms=float(np.median(lat)) if lat.size else 0.0,
                p99_ms=p99,
                mean_ms=float(lat.mean()) if lat.size else 0.0,
            )
        )
        start_s = end_s
    return out


def _feed(rule: SequentialRule, tick: Tick) -> StepRecord | None:
    """Give one tick's latencies to the rule; its verdict when a grid point was reached.

    The verdict's autocorrelation estimate sorts and transforms the whole step (~10 ms at 20,000
    requests), so it runs on gevent's thread pool: the hub keeps sending and reading meanwhile.
    """
    rule.add(tick.sequence)
    if not rule.due:
        return None
    record: StepRecord = gevent.get_hub().threadpool.apply(rule.decide)
    return record
