"""Sequential verdict of one load step: stop as soon as ``p99 <= goal`` is statistically decided.

Pure: latencies or per-window counts in, a frozen :class:`StepRecord` out. No I/O, no gevent, no
optuna; numpy and :mod:`math` only, so it is tested in milliseconds on planted series.

The statement tested
    ``p{q} <= goal`` is the same statement as "the share of requests over the goal is at most
    ``1 - q``" (a request is *over* when its latency is strictly above the goal). That share is a
    binomial proportion, so a distribution-free Clopper-Pearson bound on it decides the step: PASS
    when the upper bound is below ``1 - q``, FAIL when the lower bound is above it. Nothing is
    assumed about the shape of the latency distribution.

Autocorrelation (why not plain Clopper-Pearson)
    Under queueing, consecutive latencies are not independent: a burst puts many consecutive
    requests over the goal, and a binomial bound over ``n`` requests is then far too narrow (the
    Monte-Carlo in ``tests/unit/test_stepping.py`` shows the naive rule deciding a planted boundary
    step wrongly several times more often than its stated level). Counts are therefore deflated to
    an *effective sample size* ``n_eff = n / tau`` (and ``over_eff = over / tau``) before the bound,
    where ``tau = 1 + 2 * sum(rho_k)`` is the integrated autocorrelation time. ``tau`` is the
    largest of three estimates, none of which is trusted alone:

    * the indicator of the step's own upper tail, the requests above the series' empirical
      ``1 - TAIL_PROXY_FACTOR * (1 - q)`` quantile (its p95 for a p99 goal; Sokal's automatic
      window, cutoff ``M >= 5 tau(M)``): always estimable (5 % of the requests are in it), and it
      sees the queue's time scale even when no request has gone over the goal yet (a step with
      zero requests over would otherwise look independent). For Gaussian-copula dependence an
      indicator's correlation shrinks as its threshold rises, so the p95's ``tau`` bounds the
      p99's from above. The latencies' ranks were used first and dropped: on a shared machine
      the *bulk* drifts slowly (a busy neighbour adds 2 ms to every request for seconds), which
      put the ranks' ``tau`` at 30-400 on steps whose tail was nearly independent (``tau`` 2-4),
      so no step far below the goal could pass before its cap;
    * the over-goal indicator itself, once at least ``MIN_OVER_FOR_INDICATOR_TAU`` requests are over
      (it sees clustering in the tail that the bulk may not show);
    * the dispersion of per-window counts over the goal against binomial (batch means: the
      variance inflation of a window's count), which catches correlation longer than a window.

    The effective-sample-size route was chosen over a t-bound on per-window shares because at
    p99 most windows of a few hundred requests hold zero or one request over the goal: the
    window shares are far from normal and a window standard deviation of zero would "prove" a
    share of zero. Deflating the binomial count keeps the exact bound and its behaviour at
    small counts.

Looking repeatedly (why the confidence is split)
    The verdict is looked at after every window, so the chance of some look being wrong grows
    with the number of looks. Looks are taken only when the cumulative request count crosses a
    point of a geometric grid ``min_requests * look_growth**j`` (the last point is
    ``max_requests``); with ``K`` grid points each look is tested at level ``alpha / K``
    (``alpha = 1 - confidence``), and a window that crosses several points spends all of theirs.
    By the union bound the probability that a step ends with a wrong PASS (or a wrong FAIL) is at
    most ``alpha``. A step still undecided at ``max_requests`` is reported as BOUNDARY.

How long a step needs to be (what the callers build on the verdict)
    A window of a sequential step holds :func:`window_samples` requests (1,000 for a p99: ten
    expected over the goal at the goal itself), not a number of seconds: the window is the unit
    of the stability check and of the step's cap, and a p99 of fewer samples rests on its last
    few values. A FAIL the test decided with its lower bound at least :data:`FAR_SHARE_FACTOR`
    times the allowed share (:attr:`StepRecord.far_beyond`: with the test's confidence, more
    than twice the allowed tail is over the goal) is far beyond the goal: a capacity search
    takes it as it stands. A FAIL closer than that, or one not decided by the test (a cap, a
    guard), is the kind a latency spike can cause, and is confirmed by a repeat. Neither
    changes the test's own error rates: both read a verdict the test has already given.

What the guarantee rests on: ``tau`` is estimated, not known; the grid, not the window size,
fixes the looks; and the step's requests are one stationary regime (warm-up excluded). With
time windows the window's request count depends on throughput; the grid bounds the number of
looks regardless.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from analyzer.errors import InputError

#: The over-goal indicator's own autocorrelation is used once at least this many requests are over.
MIN_OVER_FOR_INDICATOR_TAU = 5
#: Sokal's window constant: the autocorrelation sum stops at the first lag M with M >= C * tau(M).
SOKAL_C = 5.0
#: The tail proxy's share is this many times the goal's (p95 for a p99 goal), capped at one half.
TAIL_PROXY_FACTOR = 5.0
#: A decided FAIL whose lower bound on the share over the goal is at least this many times the
#: allowed share is far beyond the goal (:attr:`StepRecord.far_beyond`): no repeat confirms it.
FAR_SHARE_FACTOR = 2.0
#: Requests over the goal a window holds at the goal itself (:func:`window_samples`).
WINDOW_TAIL_SAMPLES = 10


def window_samples(quantile: float) -> int:
    """Requests a window needs for its ``p{quantile}`` to rest on :data:`WINDOW_TAIL_SAMPLES`
    requests above it (1,000 for a p99, 200 for a p95)."""
    if not 0 < quantile < 1:
        raise InputError(f"quantile must be in (0, 1), got {quantile} (p99 is 0.99)")
    return math.ceil(round(WINDOW_TAIL_SAMPLES / (1.0 - quantile), 6))


class StepVerdict(str, enum.Enum):
    """Where a step stands against ``p{q} <= goal``."""

    #: Decided: the upper bound on the share over the goal is below ``1 - q``.
    PASS = "pass"
    #: Decided: the lower bound on the share over the goal is above ``1 - q``.
    FAIL = "fail"
    #: Not decided yet: measure another window.
    UNDECIDED = "undecided"
    #: Not decided at ``max_requests``: the step is at the boundary (its bounds straddle the goal).
    BOUNDARY = "boundary"

    @property
    def final(self) -> bool:
        """True for PASS, FAIL and BOUNDARY: the step is over."""
        return self is not StepVerdict.UNDECIDED


@dataclass(frozen=True)
class StepTest:
    """The sequential test of one load step against one latency goal."""

    #: The latency goal in milliseconds; a request is *over* when its latency is strictly above it.
    goal_ms: float
    #: The quantile the goal is about (0.99: ``p99 <= goal_ms``).
    quantile: float = 0.99
    #: Probability that a decided verdict (PASS or FAIL) is right, per side, over all looks.
    confidence: float = 0.95
    #: First look at this many requests; nothing is decided before.
    min_requests: int = 200
    #: Cap: a step still undecided here is BOUNDARY.
    max_requests: int = 20_000
    #: Looks at ``min_requests * look_growth**j`` requests (and at ``max_requests``).
    look_growth: float = 1.5
    looks: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.goal_ms > 0:
            raise InputError(
                f"the step's goal must be a positive latency in ms, got {self.goal_ms}"
            )
        if not 0.5 <= self.quantile < 1:
            raise InputError(f"quantile must be in [0.5, 1), got {self.quantile} (p99 is 0.99)")
        if not 0.5 <= self.confidence < 1:
            raise InputError(f"confidence must be in [0.5, 1), got {self.confidence} (e.g. 0.95)")
        if not 1 <= self.min_requests <= self.max_requests:
            raise InputError(
                f"need 1 <= min_requests ({self.min_requests}) <= max_requests ({self.max_requests})"
            )
        if not self.look_growth > 1:
            raise InputError(f"look_growth must be > 1, got {self.look_growth}")
        grid: list[int] = []
        j = 0
        while True:
            point = math.ceil(self.min_requests * self.look_growth**j)
            if point >= self.max_requests:
                break
            if not grid or point > grid[-1]:
                grid.append(point)
            j += 1
        grid.append(self.max_requests)
        object.__setattr__(self, "looks", tuple(grid))

    @property
    def target_share(self) -> float:
        """The largest share of requests over the goal that still meets it (``1 - quantile``)."""
        return 1.0 - self.quantile

    @property
    def alpha(self) -> float:
        """Error probability per side over the whole step (``1 - confidence``)."""
        return 1.0 - self.confidence

    def to_dict(self) -> dict[str, Any]:
        return {
            "goal_ms": self.goal_ms,
            "quantile": self.quantile,
            "confidence": self.confidence,
            "min_requests": self.min_requests,
            "max_requests": self.max_requests,
            "look_growth": self.look_growth,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepTest:
        return cls(**data)


@dataclass(frozen=True)
class StepRecord:
    """What the test says after one window: the counts, the bounds and the verdict."""

    verdict: StepVerdict
    #: Requests so far (all windows of the step).
    n: int
    #: Requests strictly over the goal so far.
    over: int
    #: Integrated autocorrelation time used (>= 1; 1 = independent).
    tau: float
    #: Effective sample size ``n / tau``.
    n_eff: float
    #: Clopper-Pearson bounds on the share over the goal from ``(over / tau, n / tau)``, each
    #: one-sided at level ``alpha_look``.
    lower_share: float
    upper_share: float
    #: ``1 - quantile``: the share the bounds are compared with.
    target_share: float
    #: Error level spent at this window (0 when the window is not a look).
    alpha_look: float
    #: Grid looks passed so far, of ``looks_total``.
    look: int
    looks_total: int
    windows: int
    #: One line saying why.
    reason: str
    #: The goal the share is counted against, ms (None in records written before it was kept).
    goal_ms: float | None = None

    @property
    def share(self) -> float:
        """Observed share of requests over the goal."""
        return self.over / self.n if self.n else 0.0

    @property
    def far_beyond(self) -> bool:
        """A FAIL the test decided (at a look, not a stop) with its lower bound on the share
        over the goal at least :data:`FAR_SHARE_FACTOR` times the allowed share: the failure
        stands without a repeat."""
        return (
            self.verdict is StepVerdict.FAIL
            and self.alpha_look > 0
            and self.lower_share >= FAR_SHARE_FACTOR * self.target_share
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        return cls(**{**data, "verdict": StepVerdict(data["verdict"])})


# --------------------------------------------------------------------------------------------------
# Clopper-Pearson on real-valued (effective) counts


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-13:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function ``I_x(a, b)`` for real ``a, b > 0``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def _beta_quantile(level: float, a: float, b: float) -> float:
    """The ``x`` with ``I_x(a, b) = level``: Newton's method kept inside a shrinking bracket."""
    lo, hi = 0.0, 1.0
    log_norm = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    x = a / (a + b)
    for _ in range(200):
        f = betainc(a, b, x) - level
        if f < 0:
            lo = x
        else:
            hi = x
        density = math.exp(log_norm + (a - 1.0) * math.log(x) + (b - 1.0) * math.log1p(-x))
        step = f / density if density > 0 else math.inf
        nxt = x - step
        if not lo < nxt < hi:
            # Outside the bracket: bisect, geometrically while it spans decades (bounds near 0).
            nxt = (
                math.sqrt(lo * hi)
                if lo > 0 and hi > 4 * lo
                else (hi / 16 if lo == 0 else 0.5 * (lo + hi))
            )
        if abs(nxt - x) <= 1e-10 * x or hi - lo <= 1e-12:
            return nxt
        x = nxt
    return x


def clopper_pearson(over: float, n: float, alpha: float) -> tuple[float, float]:
    """One-sided Clopper-Pearson bounds ``(lower, upper)`` on a share, each at level ``alpha``.

    ``over`` and ``n`` may be real (effective counts); ``P(share < lower) <= alpha`` and
    ``P(share > upper) <= alpha`` for binomial data.
    """
    if n <= 0:
        return 0.0, 1.0
    over = min(max(over, 0.0), n)
    lower = 0.0 if over <= 0 else _beta_quantile(alpha, over, n - over + 1.0)
    upper = 1.0 if over >= n else _beta_quantile(1.0 - alpha, over + 1.0, n - over)
    return lower, upper


def _passes(over: float, n: float, share: float, alpha: float) -> bool:
    """Upper bound below ``share``: ``P(Bin(n, share) <= over) < alpha``."""
    return over < n and 1.0 - betainc(over + 1.0, n - over, share) < alpha


def _fails(over: float, n: float, share: float, alpha: float) -> bool:
    """Lower bound above ``share``: ``P(Bin(n, share) >= over) < alpha``."""
    return over > 0 and betainc(over, n - over + 1.0, share) < alpha


# --------------------------------------------------------------------------------------------------
# Autocorrelation


def integrated_time(series: Sequence[float] | np.ndarray, c: float = SOKAL_C) -> float:
    """Integrated autocorrelation time ``1 + 2 * sum(rho_k)`` with Sokal's automatic window.

    The sum stops at the first lag ``M`` with ``M >= c * tau(M)``; when the series is too short
    for that, the largest partial sum is returned (the series is shorter than its correlation).
    Never below 1: a negatively correlated series is not credited with more than ``n`` samples.
    """
    y = np.asarray(series, dtype=float)
    n = y.size
    if n < 3:
        return 1.0
    y = y - y.mean()
    if not np.any(y):
        return 1.0
    size = 1 << (2 * n - 1).bit_length()
    spectrum = np.fft.rfft(y, n=size)
    acf = np.fft.irfft(spectrum * np.conjugate(spectrum), n=size)[:n]
    acf /= acf[0]
    taus = 2.0 * np.cumsum(acf) - 1.0
    lags = np.arange(n)
    ok = np.flatnonzero(lags >= c * taus)
    tau = float(taus[ok[0]]) if ok.size else float(taus.max())
    return max(1.0, tau)


def latency_tau(
    latencies_ms: Sequence[float] | np.ndarray, goal_ms: float, target_share: float = 0.01
) -> float:
    """``tau`` of a latency series (in completion order): the larger of its upper tail's
    indicator (above its own ``1 - TAIL_PROXY_FACTOR * target_share`` quantile) and, once
    ``MIN_OVER_FOR_INDICATOR_TAU`` requests are over, its over-goal indicator."""
    lat = np.asarray(latencies_ms, dtype=float)
    if lat.size < 3:
        return 1.0
    tail_share = min(0.5, TAIL_PROXY_FACTOR * target_share)
    tau = integrated_time(lat > np.quantile(lat, 1.0 - tail_share))
    over = lat > goal_ms
    count = int(over.sum())
    if count >= MIN_OVER_FOR_INDICATOR_TAU:
        tau = max(tau, integrated_time(over))
    return tau


def window_dispersion(over_counts: Sequence[int], window_ns: Sequence[int]) -> float:
    """Variance inflation of per-window counts over the goal against binomial (batch means).

    Pearson's chi-square over its degrees of freedom, with the pooled share; 1 when it cannot be
    estimated (fewer than 2 windows, or no request over / all over). Never below 1.
    """
    x = np.asarray(over_counts, dtype=float)
    m = np.asarray(window_ns, dtype=float)
    keep = m > 0
    x, m = x[keep], m[keep]
    total = m.sum()
    if x.size < 2 or total <= 0:
        return 1.0
    p = x.sum() / total
    if p <= 0.0 or p >= 1.0:
        return 1.0
    chi2 = float((((x - m * p) ** 2) / (m * p * (1.0 - p))).sum())
    return max(1.0, chi2 / (x.size - 1))


# --------------------------------------------------------------------------------------------------
# The verdict


def decide_windows(
    test: StepTest,
    over_counts: Sequence[int],
    window_ns: Sequence[int],
    tau: float | None = None,
    *,
    n_before: int | None = None,
) -> StepRecord:
    """The verdict after the last of these windows (all windows of the step so far, in order).

    Args:
        test: the goal, quantile, confidence and look grid.
        over_counts: requests strictly over ``test.goal_ms`` in each window.
        window_ns: requests in each window (same length).
        tau: integrated autocorrelation time to deflate the counts by. None: estimated from the
            dispersion of the window counts only (batch means), which cannot see clustering
            inside windows and sees nothing while no request is over; pass
            ``latency_tau(latencies, goal)`` when the latencies are at hand (``SequentialRule``
            does). ``1.0`` is the naive independent-binomial rule.
        n_before: the request count at the previous call (the grid points above it and up to
            the current count are this call's looks). None: all windows but the last, i.e.
            the previous call saw every window but this one.

    Stateless: a look happens when the windows added since ``n_before`` carry the cumulative
    count across a grid point. The first call that returns a final verdict is the step's
    verdict; stop there.
    """
    if len(over_counts) != len(window_ns):
        raise InputError(
            f"{len(over_counts)} window counts over the goal for {len(window_ns)} windows"
        )
    if any(o < 0 or o > w for o, w in zip(over_counts, window_ns, strict=True)):
        raise InputError("a window's count over the goal must be between 0 and its request count")
    n = int(sum(window_ns))
    over = int(sum(over_counts))
    if n_before is None:
        n_before = n - (int(window_ns[-1]) if window_ns else 0)
    if not 0 <= n_before <= n:
        raise InputError(f"n_before ({n_before}) must be between 0 and the request count ({n})")
    if tau is None:
        tau = window_dispersion(over_counts, window_ns)
    tau = max(1.0, float(tau))
    looks = test.looks
    passed = sum(1 for g in looks if g <= n)
    crossed = passed - sum(1 for g in looks if g <= n_before)
    alpha_look = test.alpha * crossed / len(looks)
    n_eff, over_eff = n / tau, over / tau
    shown_alpha = alpha_look if crossed else test.alpha / len(looks)
    lower, upper = clopper_pearson(over_eff, n_eff, shown_alpha)
    target = test.target_share

    def record(verdict: StepVerdict, reason: str) -> StepRecord:
        return StepRecord(
            verdict=verdict,
            n=n,
            over=over,
            tau=tau,
            n_eff=n_eff,
            lower_share=lower,
            upper_share=upper,
            target_share=target,
            alpha_look=alpha_look,
            look=passed,
            looks_total=len(looks),
            windows=len(window_ns),
            reason=reason,
            goal_ms=test.goal_ms,
        )

    pct = f"{100 * target:g}%"
    counts = f"{over}/{n} over {test.goal_ms:g} ms, n_eff {n_eff:.0f} (tau {tau:.2f})"
    level = f"one-sided level {alpha_look:.2g}, look {passed}/{len(looks)}"
    if crossed and _passes(over_eff, n_eff, target, alpha_look):
        reason = f"pass: share over <= {100 * upper:.3g}% < {pct} ({level}); {counts}"
        return record(StepVerdict.PASS, reason)
    if crossed and _fails(over_eff, n_eff, target, alpha_look):
        reason = f"fail: share over >= {100 * lower:.3g}% > {pct} ({level}); {counts}"
        return record(StepVerdict.FAIL, reason)
    if n >= test.max_requests:
        reason = (
            f"boundary: share over in [{100 * lower:.3g}%, {100 * upper:.3g}%] contains {pct} "
            f"at the cap of {test.max_requests} requests; {counts}"
        )
        return record(StepVerdict.BOUNDARY, reason)
    nxt = next(g for g in looks if g > n)
    if not crossed:
        reason = f"undecided: next look at {nxt} requests; {counts}"
    else:
        reason = (
            f"undecided: share over in [{100 * lower:.3g}%, {100 * upper:.3g}%] contains {pct} "
            f"({level}); next look at {nxt}; {counts}"
        )
    return record(StepVerdict.UNDECIDED, reason)


class SequentialRule:
    """Feed one window of latencies at a time; stop when the returned record is final.

    Example::

        rule = SequentialRule(goal_ms=60.0)
        while True:
            record = rule.update(latencies_ms_of_next_window)
            if record.verdict.final:
                break

    A load engine that collects many short intervals feeds each with :meth:`feed` instead: every
    interval is a window of the batch-means dispersion, but the verdict (and its autocorrelation
    estimate, the costly part) is computed only when the count reaches the next grid point, the
    only places a verdict can change. :meth:`stop` ends a step the rule did not decide (a time
    cap, an overload guard).
    """

    def __init__(
        self,
        goal_ms: float,
        quantile: float = 0.99,
        confidence: float = 0.95,
        min_requests: int = 200,
        max_requests: int = 20_000,
        look_growth: float = 1.5,
    ) -> None:
        self.test = StepTest(goal_ms, quantile, confidence, min_requests, max_requests, look_growth)
        self._latencies: list[np.ndarray] = []
        self._over: list[int] = []
        self._ns: list[int] = []
        self._n = 0
        #: Request count at the last verdict computed (its looks are spent).
        self._decided_n = 0
        self.record: StepRecord | None = None

    @classmethod
    def for_test(cls, test: StepTest) -> SequentialRule:
        """A rule for ``test`` (its goal, quantile, confidence and look grid)."""
        return cls(
            test.goal_ms,
            test.quantile,
            test.confidence,
            test.min_requests,
            test.max_requests,
            test.look_growth,
        )

    @property
    def n(self) -> int:
        """Requests added so far."""
        return self._n

    @property
    def final(self) -> bool:
        """The step is over (a verdict was decided, capped, or the step was stopped)."""
        return self.record is not None and self.record.verdict.final

    @property
    def due(self) -> bool:
        """The requests added since the last verdict reach a grid point: a verdict can change."""
        nxt = next((g for g in self.test.looks if g > self._decided_n), None)
        return nxt is not None and self._n >= nxt

    def add(self, latencies_ms: Sequence[float] | np.ndarray) -> None:
        """Add one window's latencies (completion order, warm-up excluded) without deciding."""
        if self.final:
            assert self.record is not None
            raise InputError(
                f"the step is already decided ({self.record.verdict.value}); start a new rule"
            )
        lat = np.asarray(latencies_ms, dtype=float).ravel()
        self._latencies.append(lat)
        self._over.append(int((lat > self.test.goal_ms).sum()))
        self._ns.append(int(lat.size))
        self._n += int(lat.size)

    def decide(self) -> StepRecord:
        """The verdict over every window added; the grid points since the last call are looked at."""
        series = np.concatenate(self._latencies) if self._latencies else np.empty(0)
        tau = max(
            latency_tau(series, self.test.goal_ms, self.test.target_share),
            window_dispersion(self._over, self._ns),
        )
        self.record = decide_windows(
            self.test, self._over, self._ns, tau=tau, n_before=self._decided_n
        )
        self._decided_n = self._n
        return self.record

    def update(self, latencies_ms: Sequence[float] | np.ndarray) -> StepRecord:
        """Add one window's latencies (completion order, warm-up excluded); return the verdict."""
        self.add(latencies_ms)
        return self.decide()

    def feed(self, latencies_ms: Sequence[float] | np.ndarray) -> StepRecord | None:
        """Add one window; the verdict when a grid point was reached (:attr:`due`), else None."""
        self.add(latencies_ms)
        return self.decide() if self.due else None

    def stop(self, verdict: StepVerdict, why: str) -> StepRecord:
        """End a step the rule has not decided: BOUNDARY (a cap other than ``max_requests``, e.g.
        the step's time) or FAIL (a guard outside the rule, e.g. a backlog beyond its bound).

        A grid point reached but not yet looked at is looked at first; when that decides, its
        verdict stands. No error level is spent by the stop itself: the bounds shown are at the
        level of one look, for reading only.
        """
        if not verdict.final or verdict is StepVerdict.PASS:
            raise InputError(f"a step is stopped as boundary or fail, not {verdict.value}")
        if self.final:
            assert self.record is not None
            return self.record
        if self.due:
            looked = self.decide()
            if looked.verdict.final:
                return looked
        series = np.concatenate(self._latencies) if self._latencies else np.empty(0)
        tau = max(
            latency_tau(series, self.test.goal_ms, self.test.target_share),
            window_dispersion(self._over, self._ns),
        )
        seen = decide_windows(self.test, self._over, self._ns, tau=tau, n_before=self._n)
        counts = seen.reason.split("; ", 1)[-1]
        self.record = replace(seen, verdict=verdict, reason=f"{verdict.value}: {why}; {counts}")
        return self.record
