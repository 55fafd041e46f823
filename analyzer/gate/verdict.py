"""CI performance gates: criteria, baseline comparison with significance, and the outputs CI reads.

A gate judges one *candidate* result, optionally against a *baseline* result::

    candidate = read_result(Path("reports/run-1"))          # run dir, summary.json, load output
    report = evaluate(candidate, Criteria(p99_ms=100, max_regression=0.05), baseline=old)
    print(render_console(report)); report.passed

Both results are first reduced to a :class:`GateInput`: the headline numbers (throughput, p99,
error rate), the repeated *samples* behind them (per-repeat values when the result holds several
runs, else per-window values of one measurement, else the single value) and the facts that decide
whether two results may be compared (model, device, scenario hash, what "throughput" means).

A generative model's result carries its token figures too (:class:`TokenFigures`: TTFT p99,
ITL p99 over tokens, output tokens/s, each with its samples), judged as the request figures are.

Verdicts:

* **Absolute criteria** (``p99_ms``, ``min_throughput_rps``, ``max_error_rate``; for token
  streams ``ttft_p99_ms``, ``itl_p99_ms``, ``min_tokens_per_s``) compare the headline value
  with the limit.
* **Regression** (``max_regression``, a fraction) fails only when the candidate is worse than the
  baseline moved by the threshold *and* a one-sided Mann-Whitney U test on the samples says so at
  level ``alpha``: for throughput, the test's alternative is "candidate < baseline x (1 - t)"; for
  p99, "candidate > baseline x (1 + t)". A change beyond the threshold that the test cannot
  confirm is reported as ``not significant`` (and passes). A side with a single sample is never
  significant, whatever the p-value: one run cannot tell a regression from a bad moment.
  When both results measured token streams, TTFT p99 and ITL p99 (lower is better) and output
  tokens/s (higher is better) are compared the same way.

This module holds the records and the verdicts (pure); beside it: ``inputs`` (results into a
:class:`GateInput`; only its :func:`~analyzer.gate.inputs.read_result` touches files),
``significance`` (the rank test) and ``render`` (Markdown, console, JUnit). Nothing opens a socket.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from analyzer.config.scenario import hash_version
from analyzer.errors import InputError
from analyzer.gate.significance import mann_whitney_greater, relative_change

#: Environment facts that must agree before two results are compared (``--force`` overrides).
COMPATIBILITY_KEYS = ("model", "device", "gpu", "scenario_hash", "measure")


class Outcome(str, enum.Enum):
    """Verdict of one criterion."""

    PASS = "pass"
    FAIL = "fail"
    #: Worse than the threshold, but the samples cannot show it is more than noise (passes).
    NOT_SIGNIFICANT = "not significant"


@dataclass(frozen=True)
class TokenFigures:
    """A generative result's token streams: the headline figures and the samples behind them
    (on the same basis as the request figures' samples).

    Attributes:
        ttft_p99_ms: Time to first token, p99.
        itl_p99_ms: Inter-token latency, p99 over every gap of every request.
        output_tokens_per_s: Generated tokens per second.
        ttft_p99_samples: Repeated TTFT p99 values behind the headline.
        itl_p99_samples: Repeated ITL p99 values behind the headline.
        tokens_per_s_samples: Repeated tokens/s values behind the headline.
    """

    ttft_p99_ms: float
    itl_p99_ms: float
    output_tokens_per_s: float
    ttft_p99_samples: tuple[float, ...]
    itl_p99_samples: tuple[float, ...]
    tokens_per_s_samples: tuple[float, ...]


@dataclass(frozen=True)
class GateInput:
    """A result reduced to what the gate judges.

    Attributes:
        label: Where the result came from (a path, or ``live <url>``).
        throughput_rps: Headline throughput (capacity, or achieved rate at a fixed load).
        p99_ms: Headline p99 latency.
        error_rate: Failed / all requests; None when the result does not record it.
        throughput_samples: Repeated throughput values behind the headline.
        p99_samples: Repeated p99 values behind the headline.
        sample_basis: ``repeats``, ``windows`` or ``single``: what one sample is.
        environment: Facts for the compatibility check (``COMPATIBILITY_KEYS``) and the report.
        notes: Caveats worth printing (unstable or invalid measurements, choices made).
        tokens: A generative model's token figures; None when the result measured no token
            streams.
    """

    label: str
    throughput_rps: float
    p99_ms: float
    error_rate: float | None
    throughput_samples: tuple[float, ...]
    p99_samples: tuple[float, ...]
    sample_basis: str
    environment: Mapping[str, str | None] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    tokens: TokenFigures | None = None


@dataclass(frozen=True)
class Criteria:
    """What the candidate must satisfy. Unset (None) criteria are not checked.

    Attributes:
        p99_ms: Highest acceptable p99 latency, milliseconds.
        min_throughput_rps: Lowest acceptable throughput, requests/s.
        max_error_rate: Highest acceptable failed fraction.
        max_regression: Largest tolerated relative worsening vs the baseline (0.05 = 5 %).
        alpha: Significance level of the regression test.
        ttft_p99_ms: Highest acceptable time to first token, p99, milliseconds.
        itl_p99_ms: Highest acceptable inter-token latency, p99 over tokens, milliseconds.
        min_tokens_per_s: Lowest acceptable output tokens/s.
    """

    p99_ms: float | None = None
    min_throughput_rps: float | None = None
    max_error_rate: float | None = None
    max_regression: float | None = None
    alpha: float = 0.05
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    min_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.p99_ms is not None and not self.p99_ms > 0:
            raise InputError(f"--p99-ms must be positive, got {self.p99_ms}")
        if self.min_throughput_rps is not None and self.min_throughput_rps < 0:
            raise InputError(f"--min-throughput-rps must be >= 0, got {self.min_throughput_rps}")
        if self.max_error_rate is not None and not 0 <= self.max_error_rate < 1:
            raise InputError(f"--max-error-rate is a fraction in [0, 1), got {self.max_error_rate}")
        if self.max_regression is not None and not 0 < self.max_regression < 1:
            raise InputError(
                f"--max-regression must be between 0% and 100%, got {self.max_regression:.1%}"
            )
        if not 0 < self.alpha < 0.5:
            raise InputError(f"--alpha must be in (0, 0.5), got {self.alpha}")
        for flag, goal in (("--ttft-p99-ms", self.ttft_p99_ms), ("--itl-p99-ms", self.itl_p99_ms)):
            if goal is not None and not goal > 0:
                raise InputError(f"{flag} must be positive, got {goal}")
        if self.min_tokens_per_s is not None and self.min_tokens_per_s < 0:
            raise InputError(f"--min-tokens-per-s must be >= 0, got {self.min_tokens_per_s}")

    @property
    def token_criteria(self) -> bool:
        """Whether an absolute criterion on token streams is set."""
        return any(
            v is not None for v in (self.ttft_p99_ms, self.itl_p99_ms, self.min_tokens_per_s)
        )

    @property
    def absolute(self) -> bool:
        """Whether any absolute criterion is set."""
        request = (self.p99_ms, self.min_throughput_rps, self.max_error_rate)
        return any(v is not None for v in request) or self.token_criteria


@dataclass(frozen=True)
class CriterionResult:
    """The verdict on one criterion (one JUnit test case, one table row)."""

    name: str
    outcome: Outcome
    measured: str
    limit: str
    detail: str
    baseline: str = ""
    change: str = ""
    p_value: float | None = None

    @property
    def failed(self) -> bool:
        return self.outcome is Outcome.FAIL


@dataclass(frozen=True)
class GateReport:
    """All verdicts of one gate run."""

    results: tuple[CriterionResult, ...]
    candidate: GateInput
    baseline: GateInput | None = None
    #: Incompatibilities that ``force`` let through (empty otherwise).
    forced: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        """True when no criterion failed (``not significant`` passes)."""
        return not any(r.failed for r in self.results)

    @property
    def failures(self) -> tuple[CriterionResult, ...]:
        return tuple(r for r in self.results if r.failed)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "inf"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit in ("req/s", "tok/s"):
        return f"{value:.1f} {unit}"
    return f"{value:.4f}" if value < 0.01 else f"{value:.2%}"


def _absolute(criteria: Criteria, c: GateInput) -> list[CriterionResult]:
    out = []
    if criteria.p99_ms is not None:
        ok = c.p99_ms <= criteria.p99_ms
        out.append(
            CriterionResult(
                name=f"p99_ms <= {criteria.p99_ms:g}",
                outcome=Outcome.PASS if ok else Outcome.FAIL,
                measured=_fmt(c.p99_ms, "ms"),
                limit=f"<= {criteria.p99_ms:g} ms",
                detail=f"p99 {_fmt(c.p99_ms, 'ms')} {'within' if ok else 'above'} the "
                f"{criteria.p99_ms:g} ms limit",
            )
        )
    if criteria.min_throughput_rps is not None:
        ok = c.throughput_rps >= criteria.min_throughput_rps
        out.append(
            CriterionResult(
                name=f"throughput_rps >= {criteria.min_throughput_rps:g}",
                outcome=Outcome.PASS if ok else Outcome.FAIL,
                measured=_fmt(c.throughput_rps, "req/s"),
                limit=f">= {criteria.min_throughput_rps:g} req/s",
                detail=f"throughput {_fmt(c.throughput_rps, 'req/s')} "
                f"{'meets' if ok else 'is below'} the {criteria.min_throughput_rps:g} req/s floor",
            )
        )
    if criteria.max_error_rate is not None:
        if c.error_rate is None:
            raise InputError(
                f"{c.label} does not record an error rate; gate its run directory (which holds "
                "the trial records) or drop --max-error-rate"
            )
        ok = c.error_rate <= criteria.max_error_rate
        out.append(
            CriterionResult(
                name=f"error_rate <= {criteria.max_error_rate:g}",
                outcome=Outcome.PASS if ok else Outcome.FAIL,
                measured=_fmt(c.error_rate, "ratio"),
                limit=f"<= {criteria.max_error_rate:g}",
                detail=f"error rate {_fmt(c.error_rate, 'ratio')} "
                f"{'within' if ok else 'above'} the limit {criteria.max_error_rate:g}",
            )
        )
    if criteria.token_criteria:
        out += _absolute_tokens(criteria, c)
    return out


def _ceiling(name: str, what: str, measured: float, limit: float) -> CriterionResult:
    """A latency figure that must stay at or below ``limit`` milliseconds."""
    ok = measured <= limit
    return CriterionResult(
        name=f"{name} <= {limit:g}",
        outcome=Outcome.PASS if ok else Outcome.FAIL,
        measured=_fmt(measured, "ms"),
        limit=f"<= {limit:g} ms",
        detail=f"{what} {_fmt(measured, 'ms')} {'within' if ok else 'above'} the {limit:g} ms limit",
    )


def _absolute_tokens(criteria: Criteria, c: GateInput) -> list[CriterionResult]:
    t = c.tokens
    if t is None:
        raise InputError(
            f"{c.label} measured no token streams, so --ttft-p99-ms, --itl-p99-ms and "
            "--min-tokens-per-s have nothing to judge: gate a generative model's result "
            "(measured with --protocol grpc-stream, generate-stream, openai or openai-chat), "
            "or drop them"
        )
    out = []
    if criteria.ttft_p99_ms is not None:
        out.append(_ceiling("ttft_p99_ms", "TTFT p99", t.ttft_p99_ms, criteria.ttft_p99_ms))
    if criteria.itl_p99_ms is not None:
        out.append(_ceiling("itl_p99_ms", "ITL p99", t.itl_p99_ms, criteria.itl_p99_ms))
    if criteria.min_tokens_per_s is not None:
        floor = criteria.min_tokens_per_s
        ok = t.output_tokens_per_s >= floor
        out.append(
            CriterionResult(
                name=f"tokens_per_s >= {floor:g}",
                outcome=Outcome.PASS if ok else Outcome.FAIL,
                measured=_fmt(t.output_tokens_per_s, "tok/s"),
                limit=f">= {floor:g} tok/s",
                detail=f"output {_fmt(t.output_tokens_per_s, 'tok/s')} "
                f"{'meets' if ok else 'is below'} the {floor:g} tok/s floor",
            )
        )
    return out


def compare_metric(
    name: str,
    candidate: Sequence[float],
    baseline: Sequence[float],
    threshold: float,
    alpha: float,
    higher_is_better: bool,
    unit: str,
    candidate_value: float | None = None,
    baseline_value: float | None = None,
) -> CriterionResult:
    """Regression verdict for one metric from repeated samples.

    Args:
        name: Metric name for the criterion (``throughput_rps``, ``p99_ms``).
        candidate: Candidate samples.
        baseline: Baseline samples.
        threshold: Tolerated relative worsening (0.05 = 5 %).
        alpha: Significance level.
        higher_is_better: True for throughput, False for latency.
        unit: ``req/s``, ``tok/s`` or ``ms`` (display only).
        candidate_value: Headline value to display (default: median of the samples).
        baseline_value: Headline value to display (default: median of the samples).

    Returns:
        FAIL when the median change is worse than ``threshold`` and the one-sided rank test
        against the threshold-shifted baseline is significant with at least two samples on each
        side; NOT_SIGNIFICANT when only the first holds; PASS otherwise.
    """
    if not candidate or not baseline:
        raise InputError(f"no samples of {name} to compare")
    cand_med = statistics.median(candidate)
    base_med = statistics.median(baseline)
    change = relative_change(cand_med, base_med)
    worse_by = -change if higher_is_better else change
    if higher_is_better:
        shifted = [b * (1.0 - threshold) for b in baseline]
        p = mann_whitney_greater(shifted, candidate)
    else:
        shifted = [b * (1.0 + threshold) for b in baseline]
        p = mann_whitney_greater(candidate, shifted)
    n = f"n={len(candidate)}/{len(baseline)}"
    direction = "lower" if change < 0 else "higher"
    what = f"median {abs(change):.1%} {direction} than the baseline"
    if worse_by <= 0:
        outcome, verdict = Outcome.PASS, f"{what}: no regression"
    elif worse_by <= threshold:
        outcome, verdict = Outcome.PASS, f"{what}: within the {threshold:.0%} tolerance"
    elif p <= alpha and min(len(candidate), len(baseline)) >= 2:
        outcome = Outcome.FAIL
        verdict = (
            f"{what}: a regression beyond {threshold:.0%}, significant (one-sided "
            f"Mann-Whitney p={p:.3g} <= {alpha:g}, {n})"
        )
    else:
        outcome = Outcome.NOT_SIGNIFICANT
        if min(len(candidate), len(baseline)) < 2:
            why = "a single sample on a side can never be significant; measure repeats"
        elif 1.0 / math.comb(len(candidate) + len(baseline), len(candidate)) > alpha:
            why = f"so few samples can never reach p <= {alpha:g}; measure more repeats"
        else:
            why = "more repeats would tell"
        verdict = (
            f"{what}: beyond {threshold:.0%} but not significant "
            f"(p={p:.3g} > {alpha:g}, {n}; {why})"
        )
    return CriterionResult(
        name=f"{name} regression <= {threshold:.0%}",
        outcome=outcome,
        measured=_fmt(cand_med if candidate_value is None else candidate_value, unit),
        limit=f"worse by <= {threshold:.0%}",
        detail=verdict,
        baseline=_fmt(base_med if baseline_value is None else baseline_value, unit),
        change=f"{change:+.1%}" if math.isfinite(change) else "inf",
        p_value=p,
    )


def incompatibilities(candidate: GateInput, baseline: GateInput) -> list[str]:
    """Why two results should not be compared (empty when they may be).

    A fact counts only when both results record it; a result with token streams and one
    without never compare (one measured a generative model, the other did not).
    """
    reasons = []
    if (baseline.tokens is None) != (candidate.tokens is None):
        which = "the candidate" if candidate.tokens is not None else "the baseline"
        reasons.append(f"only {which} measured token streams (a generative model)")
    for key in COMPATIBILITY_KEYS:
        a, b = baseline.environment.get(key), candidate.environment.get(key)
        if a is not None and b is not None and a != b:
            reason = f"{key} differs: baseline {a!r}, candidate {b!r}"
            if key == "scenario_hash" and hash_version(a) != hash_version(b):
                reason += (
                    f" (scenario hash version {hash_version(a)} vs {hash_version(b)}: an older "
                    "perfsweep hashed the scenario differently, so even the same scenario does "
                    "not match; measure the baseline again with this perfsweep, or pass --force "
                    "if both measured the same scenario)"
                )
            reasons.append(reason)
    return reasons


def evaluate(
    candidate: GateInput,
    criteria: Criteria,
    baseline: GateInput | None = None,
    force: bool = False,
) -> GateReport:
    """Judge ``candidate`` against ``criteria`` (and ``baseline``).

    Raises:
        InputError: No criterion to check, a regression threshold without a baseline (or the
            reverse), or results from incompatible environments without ``force``.
    """
    if not criteria.absolute and criteria.max_regression is None:
        raise InputError(
            "nothing to gate on: give --p99-ms, --min-throughput-rps, --max-error-rate (for "
            "token streams --ttft-p99-ms, --itl-p99-ms, --min-tokens-per-s) and/or --baseline "
            "with --max-regression (or a [gate] table)"
        )
    if (baseline is None) != (criteria.max_regression is None):
        raise InputError(
            "--baseline and --max-regression go together: a regression needs both a baseline "
            "and a tolerance"
        )
    results = _absolute(criteria, candidate)
    forced: list[str] = []
    if baseline is not None and criteria.max_regression is not None:
        reasons = incompatibilities(candidate, baseline)
        if reasons and not force:
            raise InputError(
                "refusing to compare results measured in different environments: "
                + "; ".join(reasons)
                + ". Re-measure the baseline in the same environment, or pass --force"
            )
        forced = reasons
        t, alpha = criteria.max_regression, criteria.alpha
        results.append(
            compare_metric(
                "throughput_rps",
                candidate.throughput_samples,
                baseline.throughput_samples,
                t,
                alpha,
                higher_is_better=True,
                unit="req/s",
                candidate_value=candidate.throughput_rps,
                baseline_value=baseline.throughput_rps,
            )
        )
        results.append(
            compare_metric(
                "p99_ms",
                candidate.p99_samples,
                baseline.p99_samples,
                t,
                alpha,
                higher_is_better=False,
                unit="ms",
                candidate_value=candidate.p99_ms,
                baseline_value=baseline.p99_ms,
            )
        )
        if candidate.tokens is not None and baseline.tokens is not None:
            results += _token_regressions(candidate.tokens, baseline.tokens, t, alpha)
    return GateReport(tuple(results), candidate, baseline, tuple(forced))


def _token_regressions(
    candidate: TokenFigures, baseline: TokenFigures, threshold: float, alpha: float
) -> list[CriterionResult]:
    """TTFT p99, ITL p99 and output tokens/s against the baseline's, as throughput and p99 are."""
    c, b = candidate, baseline
    return [
        compare_metric(
            "ttft_p99_ms",
            c.ttft_p99_samples,
            b.ttft_p99_samples,
            threshold,
            alpha,
            higher_is_better=False,
            unit="ms",
            candidate_value=c.ttft_p99_ms,
            baseline_value=b.ttft_p99_ms,
        ),
        compare_metric(
            "itl_p99_ms",
            c.itl_p99_samples,
            b.itl_p99_samples,
            threshold,
            alpha,
            higher_is_better=False,
            unit="ms",
            candidate_value=c.itl_p99_ms,
            baseline_value=b.itl_p99_ms,
        ),
        compare_metric(
            "tokens_per_s",
            c.tokens_per_s_samples,
            b.tokens_per_s_samples,
            threshold,
            alpha,
            higher_is_better=True,
            unit="tok/s",
            candidate_value=c.output_tokens_per_s,
            baseline_value=b.output_tokens_per_s,
        ),
    ]
