"""Is a change significant: a one-sided Mann-Whitney U test, and the relative change.

:func:`mann_whitney_greater` is exact up to :data:`EXACT_LIMIT` samples in total, with
midranks for ties, and uses the normal approximation above it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: Above this many samples in total the rank test uses the normal approximation.
EXACT_LIMIT = 60


def _rank_sum_upper_tail_exact(doubled_ranks: np.ndarray, m: int, observed: int) -> float:
    """P(sum of m of the (doubled, integer) ranks >= observed) over all equally likely subsets.

    Counts subsets by dynamic programming over the pooled values, so ties are handled exactly.
    """
    total = int(doubled_ranks.sum())
    # ways[k, s]: number of k-element subsets of the values seen so far with doubled rank sum s.
    ways = np.zeros((m + 1, total + 1), dtype=np.float64)
    ways[0, 0] = 1.0
    for r in doubled_ranks.astype(int):
        ways[1:, r:] += ways[:-1, : total + 1 - r].copy()
    row = ways[m]
    return float(row[observed:].sum() / row.sum())


def _midranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided Mann-Whitney U test: p-value for "x tends to be greater than y".

    Exact (permutation distribution of the rank sum, ties included) up to ``EXACT_LIMIT`` values
    in total; the normal approximation with tie and continuity correction beyond.

    Args:
        x: Samples that the alternative says are larger.
        y: The other samples.

    Returns:
        The p-value in (0, 1]. One sample on each side gives at least 0.5.
    """
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        return 1.0
    pooled = np.asarray([*x, *y], dtype=np.float64)
    ranks = _midranks(pooled)
    if m + n <= EXACT_LIMIT:
        doubled = np.rint(ranks * 2).astype(int)
        return _rank_sum_upper_tail_exact(doubled, m, int(doubled[:m].sum()))
    u = float(ranks[:m].sum()) - m * (m + 1) / 2.0
    big_n = m + n
    _, counts = np.unique(pooled, return_counts=True)
    tie_term = float(((counts**3) - counts).sum()) / (big_n * (big_n - 1))
    variance = m * n / 12.0 * ((big_n + 1) - tie_term)
    if variance <= 0:
        return 1.0
    z = (u - m * n / 2.0 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def relative_change(candidate: float, baseline: float) -> float:
    """candidate / baseline - 1 (inf when the baseline is 0 and the candidate is not)."""
    if baseline == 0:
        return 0.0 if candidate == 0 else math.inf
    return candidate / baseline - 1.0
