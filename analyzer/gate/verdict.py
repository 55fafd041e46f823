"""CI performance gates: criteria, baseline comparison with significance, and the outputs CI reads.

A gate judges one *candidate* result, optionally against a *baseline* result::

    candidate = read_result(Path("reports/run-1"))          # run dir, summary.json, load output
    report = evaluate(candidate, Criteria(p99_ms=100, max_regression=0.05), baseline=old)
    print(render_console(report)); report.passed

Both results are first reduced to a :class:`GateInput`: the headline numbers (throughput, p99,
error rate), the repeated *samples* behind them (per-repeat values when the result holds several
runs, else per-window values of one measurement, else the single value) and the facts that decide
whether two results may be compared (model, device, scenario hash, what "throughput" means).

Verdicts:

* **Absolute criteria** (``p99_ms``, ``min_throughput_rps``, ``max_error_rate``) compare the
  headline value with the limit.
* **Regression** (``max_regression``, a fraction) fails only when the candidate is worse than the
  baseline moved by the threshold *and* a one-sided Mann-Whitney U test on the samples says so at
  level ``alpha``: for throughput, the test's alternative is "candidate < baseline x (1 - t)"; for
  p99, "candidate > baseline x (1 + t)". A change beyond the threshold that the test cannot
  confirm is reported as ``not significant`` (and passes). A side with a single sample is never
  significant, whatever the p-value: one run cannot tell a regression from a bad moment.

Only :func:`read_result` (the last section) touches files; nothing here opens a socket.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import statistics
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.config.objective import Objective, gentlest, objective_for, worst_value
from analyzer.config.scenario import hash_version
from analyzer.errors import InputError, ResultFormatError
from analyzer.measure.generator import read_load_output
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import LoadMode
from analyzer.rundir.measurements import FixedMeasurement
from analyzer.rundir.records import SUMMARY_KIND, load_summary, load_trial
from analyzer.rundir.summary import RunSummary
from analyzer.rundir.trial_record import TrialRecord

#: Environment facts that must agree before two results are compared (``--force`` overrides).
COMPATIBILITY_KEYS = ("model", "device", "gpu", "scenario_hash", "measure")

#: Above this many samples in total the rank test uses the normal approximation.
EXACT_LIMIT = 60


class Outcome(str, enum.Enum):
    """Verdict of one criterion."""

    PASS = "pass"
    FAIL = "fail"
    #: Worse than the threshold, but the samples cannot show it is more than noise (passes).
    NOT_SIGNIFICANT = "not significant"


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


@dataclass(frozen=True)
class Criteria:
    """What the candidate must satisfy. Unset (None) criteria are not checked.

    Attributes:
        p99_ms: Highest acceptable p99 latency, milliseconds.
        min_throughput_rps: Lowest acceptable throughput, requests/s.
        max_error_rate: Highest acceptable failed fraction.
        max_regression: Largest tolerated relative worsening vs the baseline (0.05 = 5 %).
        alpha: Significance level of the regression test.
    """

    p99_ms: float | None = None
    min_throughput_rps: float | None = None
    max_error_rate: float | None = None
    max_regression: float | None = None
    alpha: float = 0.05

    def __post_init__(self) -> None:
        if self.p99_ms is not None and not self.p99_ms > 0:
            raise InputError(f"--p99-ms must be positive, got {self.p99_ms}")
        if self.min_throughput_rps is not None and self.min_throughput_rps < 0:
            raise InputError(f"--min-throughput must be >= 0, got {self.min_throughput_rps}")
        if self.max_error_rate is not None and not 0 <= self.max_error_rate < 1:
            raise InputError(f"--max-error-rate is a fraction in [0, 1), got {self.max_error_rate}")
        if self.max_regression is not None and not 0 < self.max_regression < 1:
            raise InputError(
                f"--max-regression must be between 0% and 100%, got {self.max_regression:.1%}"
            )
        if not 0 < self.alpha < 0.5:
            raise InputError(f"--alpha must be in (0, 0.5), got {self.alpha}")

    @property
    def absolute(self) -> bool:
        """Whether any absolute criterion is set."""
        return any(
            v is not None for v in (self.p99_ms, self.min_throughput_rps, self.max_error_rate)
        )


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


# --------------------------------------------------------------------------------------------------
# Statistics


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


# --------------------------------------------------------------------------------------------------
# Verdicts


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value):
        return "inf"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "req/s":
        return f"{value:.1f} req/s"
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
        unit: ``req/s`` or ``ms`` (display only).
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

    A fact counts only when both results record it.
    """
    reasons = []
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
            "nothing to gate on: give --p99-ms, --min-throughput, --max-error-rate and/or "
            "--baseline with --max-regression (or a [gate] table)"
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
    return GateReport(tuple(results), candidate, baseline, tuple(forced))


# --------------------------------------------------------------------------------------------------
# Outputs


def _describe(g: GateInput) -> str:
    env = g.environment
    facts = [f"{k} {env[k]}" for k in ("model", "device", "measure") if env.get(k)]
    n = len(g.throughput_samples)
    facts.append(f"{n} {g.sample_basis}" if g.sample_basis != "single" else "1 sample")
    return f"{g.label} ({', '.join(facts)})"


_COLUMNS = ("criterion", "measured", "limit", "baseline", "change", "verdict")


def _row(r: CriterionResult) -> tuple[str, ...]:
    return (r.name, r.measured, r.limit, r.baseline, r.change, r.outcome.value)


def render_markdown(report: GateReport) -> str:
    """A Markdown summary (for ``$GITHUB_STEP_SUMMARY`` and merge-request comments)."""
    title = "passed" if report.passed else "FAILED"
    lines = [
        f"### perfsweep gate: {title}",
        "",
        "| " + " | ".join(_COLUMNS) + " |",
        "|" + "---|" * len(_COLUMNS),
    ]
    for r in report.results:
        cells = [c.replace("|", "\\|") for c in _row(r)]
        if r.failed:
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"- candidate: {_describe(report.candidate)}"]
    if report.baseline is not None:
        lines.append(f"- baseline: {_describe(report.baseline)}")
    lines += [f"- {r.name}: {r.detail}" for r in report.results]
    lines += [f"- forced despite: {reason}" for reason in report.forced]
    notes = [*report.candidate.notes, *(report.baseline.notes if report.baseline else ())]
    lines += [f"- note: {note}" for note in notes]
    return "\n".join(lines) + "\n"


def render_console(report: GateReport) -> str:
    """A short plain-text table for the CI log."""
    rows = [_COLUMNS, *(_row(r) for r in report.results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    text = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    text.insert(1, "  ".join("-" * w for w in widths))
    verdict = "PASSED" if report.passed else f"FAILED ({len(report.failures)} of {len(rows) - 1})"
    return "\n".join([*text, f"gate {verdict}"]) + "\n"


def render_junit(report: GateReport, suite: str = "perfsweep gate") -> str:
    """JUnit XML: one test case per criterion; a failed criterion carries a ``<failure>``."""
    failures = str(len(report.failures))
    tests = str(len(report.results))
    root = ET.Element(
        "testsuites", name=suite, tests=tests, failures=failures, errors="0", time="0"
    )
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=tests,
        failures=failures,
        errors="0",
        skipped="0",
        time="0",
    )
    props = ET.SubElement(ts, "properties")
    ET.SubElement(props, "property", name="candidate", value=_describe(report.candidate))
    if report.baseline is not None:
        ET.SubElement(props, "property", name="baseline", value=_describe(report.baseline))
    for r in report.results:
        case = ET.SubElement(ts, "testcase", classname="perfsweep.gate", name=r.name, time="0")
        if r.failed:
            failure = ET.SubElement(case, "failure", message=r.detail, type="GateFailed")
            failure.text = f"measured {r.measured}, limit {r.limit}"
        out = ET.SubElement(case, "system-out")
        out.text = f"{r.outcome.value}: {r.detail}"
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, "unicode") + "\n"


# --------------------------------------------------------------------------------------------------
# Reading results (pure: from parsed documents)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def from_measurements(
    measurements: Sequence[Measurement],
    label: str,
    environment: Mapping[str, str | None],
) -> GateInput:
    """Repeats of one fixed load level (or a single measurement, sampled by its windows)."""
    if not measurements:
        raise InputError(f"{label}: no measurement to gate")
    notes = []
    for i, m in enumerate(measurements, start=1):
        where = f"{label} repeat {i}" if len(measurements) > 1 else label
        # Stability is not required: the gate's repeats and rank test are its answer to noise.
        if not m.valid:
            notes.append(
                f"{where}: invalid measurement (generator limits): {'; '.join(m.messages)}"
            )
    requests = sum(m.request_count for m in measurements)
    errors = sum(m.error_count for m in measurements)
    if len(measurements) > 1:
        tp = tuple(m.throughput_rps for m in measurements)
        p99 = tuple(m.p99_ms for m in measurements)
        return GateInput(
            label,
            _median(tp),
            _median(p99),
            errors / requests if requests else 1.0,
            tp,
            p99,
            "repeats",
            dict(environment),
            tuple(notes),
        )
    m = measurements[0]
    windows = [w for w in m.windows if w.request_count > 0]
    if len(windows) >= 2:
        tp = tuple(w.throughput_rps for w in windows)
        p99 = tuple(w.p99_ms for w in windows)
        basis = "windows"
    else:
        tp, p99, basis = (m.throughput_rps,), (m.p99_ms,), "single"
    error_rate = m.error_rate if requests else 1.0
    return GateInput(
        label,
        m.throughput_rps,
        m.p99_ms,
        error_rate,
        tp,
        p99,
        basis,
        dict(environment),
        tuple(notes),
    )


def level_name(m: Measurement) -> str:
    """``request_rate 50`` / ``concurrency 8``: what a fixed-level throughput means."""
    return f"{m.mode.value} {m.target:g}"


def from_load_document(doc: Mapping[str, Any], label: str, level: float | None = None) -> GateInput:
    """A ``perfsweep load --output`` (or ``perfsweep gate --output``) document.

    With a capacity search the headline is the capacity; otherwise one load level is judged:
    ``level`` (its target), else the only level, else the highest one. Several results at the
    same level are repeats.
    """
    measurements, capacity = read_load_output(doc)
    env_doc = doc.get("environment") or {}
    env: dict[str, str | None] = {
        "model": _str(env_doc.get("model")),
        "device": _str(env_doc.get("device")),
        "gpu": _str(env_doc.get("gpu")),
        "scenario_hash": _str(env_doc.get("scenario_hash")),
        "host": _str(env_doc.get("host")),
    }
    if capacity is not None and level is None:
        env["measure"] = f"capacity at p99 <= {capacity.goals.p99_ms:g} ms"
        point = capacity.best or gentlest(capacity.points)
        p99 = point.p99_ms if point else math.inf
        err = point.error_rate if point else 1.0
        notes = () if capacity.bracketed else (f"{label}: capacity not bracketed",)
        return GateInput(
            label,
            capacity.capacity_rps,
            p99,
            err,
            (capacity.capacity_rps,),
            (p99,),
            "single",
            env,
            notes,
        )
    levels: dict[tuple[LoadMode, float], list[Measurement]] = {}
    for m in measurements:
        levels.setdefault((m.mode, m.target), []).append(m)
    if not levels:
        raise InputError(f"{label} holds no measurement")
    if level is not None:
        chosen = [k for k in levels if k[1] == level]
        if not chosen:
            have = ", ".join(f"{t:g}" for _, t in levels)
            raise InputError(f"{label} has no load level {level:g} (levels: {have}); fix --level")
        key = chosen[0]
    else:
        key = max(levels, key=lambda k: k[1])
    picked = levels[key]
    env["measure"] = level_name(picked[0])
    result = from_measurements(picked, label, env)
    if len(levels) > 1 and level is None:
        note = (
            f"{label}: judged the highest load level ({level_name(picked[0])}); pick with --level"
        )
        result = dataclasses.replace(result, notes=(*result.notes, note))
    return result


def from_summary(
    summary: RunSummary,
    label: str,
    trial_record: TrialRecord | None = None,
) -> GateInput:
    """A sweep's ``summary.json`` (and, from a run directory, the chosen trial's record).

    The chosen config is ``best`` (the baseline config when nothing met the sweep's goals).
    When validation re-measured it, its repeats are the samples and their worst case the
    headline (:meth:`Objective.repeat_figure`, the figure the report states too: longer windows
    than the search step); otherwise, for a fixed-load trial, the trial record's windows are the
    samples; else the single search value.
    """
    notes: list[str] = []
    entry = summary.best
    if entry is None:
        entry = summary.baseline
        notes.append(f"{label}: no config met the sweep's goals; judging the baseline config")
    if entry is None:
        raise InputError(f"{label} has neither a best nor a baseline result")
    if not entry.meets_goals:
        notes.append(f"{label}: the judged config missed the sweep's own goals")
    objective = objective_for(summary.objective)
    environment = summary.environment
    gpu = environment.get("gpu")
    env: dict[str, str | None] = {
        "model": _str(summary.model),
        "device": _str(summary.device),
        "gpu": (", ".join(gpu) or None) if isinstance(gpu, list) else _str(gpu),
        "scenario_hash": _str(environment.get("scenario_hash")),
        "measure": objective.measure_text(summary.goals, summary.scenario.get("traffic") or {}),
        "host": _str(environment.get("host")),
    }
    throughput, p99 = entry.throughput_rps, entry.p99_ms
    tp_samples: tuple[float, ...] = (throughput,)
    p99_samples: tuple[float, ...] = (p99,)
    basis = "single"
    number = entry.trial_number
    candidate = summary.candidate(number)
    if candidate is not None and candidate.throughput_rps and candidate.p99_ms:
        # Validation re-measured the chosen config with longer windows: trust it over the
        # search step, and judge the worst repeat, as the sweep chose and the report states.
        tp_samples, p99_samples = candidate.throughput_rps, candidate.p99_ms
        throughput = _repeat_figure(objective, "throughput_rps", tp_samples)
        p99 = _repeat_figure(objective, "p99_ms", p99_samples)
        basis = "repeats" if len(tp_samples) > 1 else "single"
        notes.append(
            f"{label}: judged the validation repeats of trial {number}, not its search step"
        )
        missed = [i for i, ok in enumerate(candidate.meets_goals, start=1) if not ok]
        if missed:
            # The sweep's one rule (analyzer.measure.goals.goals_met): such a repeat's numbers may
            # describe a saturated generator, not the server.
            notes.append(
                f"{label}: validation repeat(s) {', '.join(map(str, missed))} of trial "
                f"{number} missed the sweep's goals (invalid or beyond the goal)"
            )
    error_rate = None
    if trial_record is not None:
        error_rate = trial_record.error_rate
        measured = trial_record.measurement
        if basis == "single" and isinstance(measured, FixedMeasurement):
            windows = [w for w in measured.level.windows if w.request_count > 0]
            if len(windows) >= 2:
                tp_samples = tuple(w.throughput_rps for w in windows)
                p99_samples = tuple(w.p99_ms for w in windows)
                basis = "windows"
    return GateInput(
        label,
        throughput,
        p99,
        error_rate,
        tp_samples,
        p99_samples,
        basis,
        env,
        tuple(notes),
    )


def _repeat_figure(objective: Objective, metric: str, values: Sequence[float]) -> float:
    """The headline of repeated values: :meth:`Objective.repeat_figure` for the objective's own
    metric, the same worst-repeat rule (:func:`analyzer.config.objective.worst_value`) for the other."""
    if metric == objective.metric:
        return objective.repeat_figure(values)
    return worst_value(metric, values)


def _str(value: Any) -> str | None:
    return None if value is None or value == [] else str(value)


# --------------------------------------------------------------------------------------------------
# Reading results (I/O)


def read_result(path: Path, level: float | None = None) -> GateInput:
    """Read a run directory, a ``summary.json`` or a ``perfsweep load``/``gate`` output file.

    Raises:
        InputError: The path does not exist or holds no result.
        ResultFormatError: A result of a format version this perfsweep cannot read.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"result {path} does not exist")
    if path.is_dir():
        if not (path / "summary.json").is_file():
            raise InputError(
                f"{path} is not a finished run directory (no summary.json); pass a run directory, "
                "a summary.json or a `perfsweep load --output` file"
            )
        path = path / "summary.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {path} as JSON: {exc}") from exc
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind == SUMMARY_KIND:
        summary = load_summary(path)  # version check with the run directory's own message
        record = None
        chosen = summary.chosen
        if chosen is not None:
            number = chosen.trial_number
            name = "baseline" if number < 0 else f"trials/{number:03d}"
            trial_path = path.parent / name / "measurement.json"
            if trial_path.is_file():
                record = load_trial(trial_path)
        return from_summary(
            summary, str(path.parent if path.name == "summary.json" else path), record
        )
    if kind == "perfsweep.load":
        return from_load_document(doc, str(path), level)
    raise ResultFormatError(
        f"{path} is not a perfsweep result (kind={kind!r}); pass a run directory, a summary.json "
        "or a `perfsweep load --output` file"
    )
