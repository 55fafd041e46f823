"""Exact latencies: HDR histograms of integer microseconds, merged, read as percentiles.

Range 1 µs .. 10 minutes at 3 significant figures (at most 0.1 % relative error); larger
values are clamped, never dropped. :class:`LatencySummary` is what records expose (ms).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from hdrh.histogram import HdrHistogram

#: Histogram range in microseconds: 1 µs .. 10 minutes. Larger values are clamped, never dropped.
HIST_LOWEST_US = 1
HIST_HIGHEST_US = 600_000_000
HIST_SIGNIFICANT_FIGURES = 3


def new_histogram() -> HdrHistogram:
    """Return an empty latency histogram in microseconds with perfsweep's standard range."""
    return HdrHistogram(HIST_LOWEST_US, HIST_HIGHEST_US, HIST_SIGNIFICANT_FIGURES)


def record_us(hist: HdrHistogram, value_us: float) -> None:
    """Record one latency, clamped into the histogram's range.

    ``HdrHistogram.record_value`` silently drops out-of-range values; a latency is never dropped
    here: anything above the range counts as the range's maximum.
    """
    hist.record_value(min(max(int(value_us), HIST_LOWEST_US), HIST_HIGHEST_US))


def merge_encoded(blobs: Iterable[str]) -> HdrHistogram:
    """Merge encoded histograms (``HdrHistogram.encode()``, e.g. shipped from workers) into one."""
    total = new_histogram()
    for blob in blobs:
        if blob:
            total.decode_and_add(blob)
    return total


def merge_histograms(hists: Iterable[HdrHistogram]) -> HdrHistogram:
    """Merge histograms into a new one (exact: same bucket layout everywhere)."""
    total = new_histogram()
    for hist in hists:
        total.add(hist)
    return total


@functools.cache
def _bucket_values() -> tuple[np.ndarray, np.ndarray]:
    """Highest- and median-equivalent value of every counts index (same layout for all histograms)."""
    h = new_histogram()
    lowest = [h.get_value_from_index(i) for i in range(h.counts_len)]
    highest = np.array([h.get_highest_equivalent_value(v) for v in lowest], dtype=np.float64)
    median = np.array([h._hdr_median_equiv_value(v) for v in lowest], dtype=np.float64)
    return highest, median


def percentiles_us(hist: HdrHistogram, percentiles: Sequence[float]) -> dict[float, float]:
    """``HdrHistogram.get_value_at_percentile`` for several percentiles at once, vectorised.

    hdrh walks its 17k counters in pure Python (~50 ms per summary), which would stall the
    gevent hub and show up as send lag; numpy over the same counters gives identical values.
    """
    total = hist.get_total_count()
    if total == 0:
        return {p: 0.0 for p in percentiles}
    counts = np.ctypeslib.as_array(hist.counts)[: hist.counts_len]
    cumulative = np.cumsum(counts)
    highest, _ = _bucket_values()
    out = {}
    for p in percentiles:
        target = max(int(min(p, 100.0) * total / 100 + 0.5), 1)
        index = int(np.searchsorted(cumulative, target, side="left"))
        out[p] = float(highest[min(index, len(highest) - 1)])
    return out


def count_above_us(hist: HdrHistogram, value_us: float) -> int:
    """How many recorded values are above ``value_us`` (to bucket precision)."""
    if hist.get_total_count() == 0:
        return 0
    counts = np.ctypeslib.as_array(hist.counts)[: hist.counts_len]
    highest, _ = _bucket_values()
    return int(counts[highest > value_us].sum())


def mean_us(hist: HdrHistogram) -> float:
    """``HdrHistogram.get_mean_value``, vectorised.

    A multiply and a sum, not ``np.dot``: over the histogram's ~21,000 buckets OpenBLAS's dot
    wakes its worker threads, which then spin ~100 ms each time, so the generator read 110 % of a
    core at every window close (its levels invalid) and took a core from the server beside it."""
    total = hist.get_total_count()
    if total == 0:
        return 0.0
    counts = np.ctypeslib.as_array(hist.counts)[: hist.counts_len]
    _, median = _bucket_values()
    return float((counts * median).sum() / total)


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles of one latency distribution, in milliseconds."""

    count: int = 0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    p999_ms: float = 0.0
    mean_ms: float = 0.0
    max_ms: float = 0.0

    @classmethod
    def from_histogram(cls, hist: HdrHistogram) -> LatencySummary:
        """Summarise a microsecond histogram (an empty one gives all zeros)."""
        count = hist.get_total_count()
        if count == 0:
            return cls()
        pct = percentiles_us(hist, [50, 90, 95, 99, 99.9])
        return cls(
            count=count,
            p50_ms=pct[50] / 1000.0,
            p90_ms=pct[90] / 1000.0,
            p95_ms=pct[95] / 1000.0,
            p99_ms=pct[99] / 1000.0,
            p999_ms=pct[99.9] / 1000.0,
            mean_ms=mean_us(hist) / 1000.0,
            max_ms=hist.get_max_value() / 1000.0,
        )
