"""Honest uncertainty: the sample counts behind a percentile, and the interval of a gain.

:func:`p99_sample_note` marks a p99 from few samples; :func:`gain_estimate` bootstraps the
ratio of two configs' values from their repeated samples and :func:`gain_sentence` words it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: A p99 from fewer samples than this is marked "low-sample": it rests on its last few values.
LOW_SAMPLE_P99 = 1000


def rank_from_top(count: int, percentile: float = 99.0) -> int:
    """Which value from the top the HDR percentile of ``count`` samples is (1 = the maximum).

    Same rank rule as :func:`percentiles_us`: with 40 samples the p99 is the maximum, with 200
    the third largest.
    """
    if count <= 0:
        return 0
    target = max(int(min(percentile, 100.0) * count / 100 + 0.5), 1)
    return count - min(target, count) + 1


def p99_sample_note(count: int | None) -> str | None:
    """A footnote for a p99 of ``count`` samples below :data:`LOW_SAMPLE_P99`; None when enough."""
    if count is None or count >= LOW_SAMPLE_P99:
        return None
    if count <= 0:
        return "p99 of no sample"
    rank = rank_from_top(count)
    which = "the maximum" if rank == 1 else f"the {_ordinal(rank)} largest latency"
    return (
        f"low-sample p99: {count} samples, so the p99 is {which} "
        f"(a p99 needs >= {LOW_SAMPLE_P99} samples to mean its name)"
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class GainSample:
    """One measurement of one side of a gain: the value and the range the truth lies in.

    Attributes:
        value: What was measured (a capacity in req/s, or a p99 in ms).
        low: Lowest value the measurement allows (a capacity: the highest passing rate).
        high: Highest value it allows (a capacity: the lowest failing rate above it; a p99: the
            worst window's p99). Equal to ``value`` when nothing bounds it.
        censored: Nothing above ``value`` was measured to fail (a capacity search that met the
            goals at every rate it offered, up to the generator's ceiling): the truth is at
            least ``value``, with no upper bound.
    """

    value: float
    low: float
    high: float
    censored: bool = False


@dataclass(frozen=True)
class GainEstimate:
    """A gain (best over baseline, > 1 = better) with its bootstrap confidence interval.

    ``ci_high`` is None when the best side is censored (its capacity is a lower bound): the
    interval is then one-sided, ``[ci_low, inf)``, and the gain reads "at least ci_low".
    ``ci_low`` is None when the baseline side is (the gain is at most ``ci_high``).
    """

    gain: float
    ci_low: float | None
    ci_high: float | None
    #: The interval excludes 1.0.
    significant: bool
    #: Validation repeats behind (best, baseline).
    repeats: tuple[int, int]
    confidence: float = 0.95

    def sentence(self) -> str:
        """The one sentence the console, summary.json and the report all print."""
        return gain_sentence(
            self.gain, (self.ci_low, self.ci_high), self.significant, self.repeats, self.confidence
        )


def gain_sentence(
    gain: float,
    ci: Sequence[float | None] | None,
    significant: bool | None,
    repeats: Sequence[int] | None,
    confidence: float = 0.95,
) -> str:
    """``gain over baseline: 1.20x, no significant difference (95% interval 0.91-1.58x ...)``;
    with a censored side, a one-sided bound: ``gain over baseline: at least 4.46x (...)``."""
    if ci is None or significant is None:
        return f"gain over baseline: {gain:.2f}x (no interval: not recorded)"
    n_best, n_base = (int(repeats[0]), int(repeats[-1])) if repeats else (1, 1)
    per_side = (
        f"{n_best} repeat{'s' if n_best != 1 else ''} per side"
        if n_best == n_base
        else f"{n_best} and {n_base} repeats"
    )
    low, high = ci[0], ci[1]
    if low is None and high is None:
        return (
            f"gain over baseline: {gain:.2f}x (no interval: both capacities are lower bounds, "
            "each config met the goals at every rate offered)"
        )
    if high is None or low is None:
        bound, word, side = (
            (low, "at least", "the best config")
            if high is None
            else (high, "at most", "the baseline")
        )
        assert bound is not None
        why = (
            f"{side} met the goals at every rate offered, so its capacity is a lower bound; "
            f"{confidence:.0%} one-sided bound, {per_side}"
        )
        if significant:
            return f"gain over baseline: {word} {bound:.2f}x ({why})"
        return (
            f"gain over baseline: {word} {bound:.2f}x, not significantly different from 1.0 ({why})"
        )
    interval = f"{confidence:.0%} interval {low:.2f}-{high:.2f}x"
    if significant:
        text = f"gain over baseline: {gain:.2f}x ({interval}, {per_side})"
    else:
        text = (
            f"gain over baseline: {gain:.2f}x, no significant difference "
            f"({interval} includes 1.0; {per_side})"
        )
    if min(n_best, n_base) < 2:
        text += (
            "; with one repeat the interval covers the measurement's resolution only, not "
            'run-to-run noise: set budget.validation = "repeats" (budget.validate_repeats >= 2)'
        )
    return text


def gain_estimate(
    best: Sequence[GainSample],
    baseline: Sequence[GainSample],
    *,
    higher_is_better: bool = True,
    seed: int = 0,
    confidence: float = 0.95,
    replicates: int = 4000,
) -> GainEstimate | None:
    """Bootstrap interval of the worst-case gain (the headline: worst best / worst baseline).

    What it covers: where each capacity lies inside its search bracket (a capacity search only
    brackets the capacity: the truth is anywhere between the highest passing and the lowest
    failing rate), and, with several repeats, their run-to-run spread. Each replicate resamples
    each side's repeats with replacement and draws every resampled value uniformly within its
    :class:`GainSample` range; the statistic is the headline's, the worst value of each side
    (lowest capacity, highest p99). The gain itself is the headline's ratio (of the passing
    rates). Coverage on planted brackets: tests/unit/test_gain_interval.py.

    A censored side (its capacity met the goals at every rate offered, so it is only a lower
    bound) has no upper end: a censored best gives a one-sided lower bound (its
    ``1 - confidence`` quantile; ``ci_high`` None), a censored baseline a one-sided upper
    bound. Seeded, so a run directory's interval is reproducible. None when a side has no
    sample or a worst value is not positive.
    """
    if not best or not baseline:
        return None

    def worst(values: np.ndarray) -> np.ndarray:
        return values.min(axis=-1) if higher_is_better else values.max(axis=-1)

    def ratio(b: np.ndarray | float, a: np.ndarray | float) -> Any:
        return np.divide(b, a) if higher_is_better else np.divide(a, b)

    best_value = worst(np.array([s.value for s in best]))
    base_value = worst(np.array([s.value for s in baseline]))
    if not (best_value > 0 and base_value > 0):
        return None
    rng = np.random.default_rng(seed)

    def replicate(side: Sequence[GainSample]) -> np.ndarray:
        low = np.array([s.low for s in side])
        high = np.array([max(s.high, s.low) for s in side])
        picks = rng.integers(0, len(side), size=(replicates, len(side)))
        draws = low[picks] + rng.random(picks.shape) * (high[picks] - low[picks])
        return worst(draws)

    best_draws, base_draws = replicate(best), replicate(baseline)
    ok = (best_draws > 0) & (base_draws > 0)
    gains = ratio(best_draws[ok], base_draws[ok]) if ok.any() else np.array([0.0])
    # Which ends are open: a censored capacity has no upper end, so neither has the gain on its
    # side (a latency objective's samples are never censored).
    open_high = higher_is_better and any(s.censored for s in best)
    open_low = higher_is_better and any(s.censored for s in baseline)
    tail = (1 - confidence) * 100 if open_high != open_low else (1 - confidence) / 2 * 100
    lo_q, hi_q = (float(x) for x in np.percentile(gains, [tail, 100 - tail]))
    gain = float(ratio(best_value, base_value))
    # The measured gain lies inside its interval (it can fall just outside when one bracket is
    # much wider than the other); rounded as printed, so text and flag agree.
    low = None if open_low else round(min(lo_q, gain), 3)
    high = None if open_high else round(max(hi_q, gain), 3)
    gain = round(gain, 3)
    return GainEstimate(
        gain=gain,
        ci_low=low,
        ci_high=high,
        # Rounded as printed, so text and flag agree.
        significant=bool((low is not None and low > 1.0) or (high is not None and high < 1.0)),
        repeats=(len(best), len(baseline)),
        confidence=confidence,
    )
