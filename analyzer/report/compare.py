"""Two runs side by side (``perfsweep report RUN --compare OTHER``), differences called out.

Typical use: the same sweep before and after a model or server change. Run A is the one the
comparison is about (after), run B the reference (before); every change is stated as A vs B.
``build_comparison`` is pure (two report records in, a comparison record out);
``render_comparison`` draws it.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from analyzer.config.scenario import hash_version
from analyzer.report.record import (
    REPORT_FORMAT_VERSION,
    ConfigResult,
    LoadCurve,
    ReportRecord,
    jsonable,
)
from analyzer.report.server_figures import load_curves_figure
from analyzer.report.svg import BEST, INFEASIBLE, SECONDARY, Figure, new_figure, styled, to_svg

#: Relative changes smaller than this are called "about the same" (measurement noise).
NOISE = 0.05


@dataclass(frozen=True)
class CompareRow:
    """One metric of both runs.

    Attributes:
        metric: What is compared (plain words with the unit).
        a: Run A's value (None: not available).
        b: Run B's value.
        change: (a - b) / b, None when either is missing or b is 0.
        better: "a", "b", "same" (within noise) or None (not comparable).
    """

    metric: str
    a: float | None
    b: float | None
    change: float | None
    better: str | None


@dataclass(frozen=True)
class RunIdentity:
    """Which run is which."""

    run_id: str
    model: str
    device: str
    objective: str
    machine: str
    goals: dict[str, Any]
    best_label: str | None


@dataclass(frozen=True)
class Comparison:
    """Everything the comparison page shows, as data (embedded as JSON)."""

    a: RunIdentity
    b: RunIdentity
    rows: tuple[CompareRow, ...]
    #: Plain sentences, most important first: what differs between the runs and by how much.
    differences: tuple[str, ...]
    best_config_diff: str | None
    format_version: int = REPORT_FORMAT_VERSION
    kind: str = "perfsweep.comparison"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return jsonable(dataclasses.asdict(self))


def _identity(r: ReportRecord) -> RunIdentity:
    v = r.verdict
    return RunIdentity(
        run_id=r.provenance.run_id,
        model=v.model,
        device=v.device,
        objective=v.objective,
        machine=v.machine,
        goals=dict(v.goals),
        best_label=v.best.label if v.best else None,
    )


def _row(
    metric: str, a: float | None, b: float | None, higher_is_better: bool | None
) -> CompareRow:
    """One metric; ``higher_is_better`` None: a count, not a quality (no "better" side)."""
    change = None
    better = None
    if a is not None and b is not None and b != 0:
        change = round((a - b) / abs(b), 4)
        if higher_is_better is not None:
            better = (
                "same" if abs(change) < NOISE else "a" if (change > 0) == higher_is_better else "b"
            )
    return CompareRow(metric, a, b, change, better)


def _attr(result: ConfigResult | None, name: str) -> float | None:
    return None if result is None else float(getattr(result, name))


def build_comparison(a: ReportRecord, b: ReportRecord) -> Comparison:
    """Compare run A with run B.

    Args:
        a: The run the comparison is about (e.g. after a change).
        b: The reference run (e.g. before).

    Returns:
        Side-by-side metrics and the differences in plain sentences.
    """
    va, vb = a.verdict, b.verdict
    rows = [
        _row(
            "best throughput within the goal (req/s)",
            _attr(va.best, "throughput_rps"),
            _attr(vb.best, "throughput_rps"),
            True,
        ),
        _row(
            "best throughput, validation worst repeat (req/s)",
            va.best.validated_throughput_rps if va.best else None,
            vb.best.validated_throughput_rps if vb.best else None,
            True,
        ),
        _row("best p99 (ms)", _attr(va.best, "p99_ms"), _attr(vb.best, "p99_ms"), False),
        _row("best p50 (ms)", _attr(va.best, "p50_ms"), _attr(vb.best, "p50_ms"), False),
        _row(
            "baseline throughput (req/s)",
            _attr(va.baseline, "throughput_rps"),
            _attr(vb.baseline, "throughput_rps"),
            True,
        ),
        _row(
            "baseline p99 (ms)",
            _attr(va.baseline, "p99_ms"),
            _attr(vb.baseline, "p99_ms"),
            False,
        ),
        _row("gain over own baseline (x)", va.gain, vb.gain, True),
        _row(
            "complete trials",
            float(va.trials.get("complete", 0)),
            float(vb.trials.get("complete", 0)),
            None,
        ),
    ]
    differences: list[str] = []
    served = rows[0]
    if served.change is not None:
        if served.better == "same":
            differences.append(
                f"Best throughput within the goal is about the same: {served.a:.1f} vs "
                f"{served.b:.1f} req/s ({served.change:+.1%}, within {NOISE:.0%} noise)."
            )
        else:
            word = "more" if served.change > 0 else "less"
            differences.append(
                f"A serves {abs(served.change):.1%} {word} throughput within the goal than B: "
                f"{served.a:.1f} vs {served.b:.1f} req/s."
            )
    elif va.best is None or vb.best is None:
        which = " and ".join(n for n, v in (("A", va), ("B", vb)) if v.best is None)
        differences.append(f"No config met the goals in run {which}.")
    for label, x, y in (
        ("Model", va.model, vb.model),
        ("Device", va.device, vb.device),
        ("Objective", va.objective, vb.objective),
        ("Machine", va.machine, vb.machine),
    ):
        if x != y:
            differences.append(f"{label} differs: A {x}, B {y}.")
    if va.goals != vb.goals:
        changed = sorted(
            k for k in set(va.goals) | set(vb.goals) if va.goals.get(k) != vb.goals.get(k)
        )
        differences.append(
            "Goals differ ("
            + ", ".join(f"{k}: A {va.goals.get(k)}, B {vb.goals.get(k)}" for k in changed)
            + "): the numbers are not measured against the same target."
        )
    if va.best and vb.best and va.best.config != vb.best.config:
        knobs = sorted(set(va.best.config) | set(vb.best.config))
        parts = [
            f"{k} {vb.best.config.get(k)} -> {va.best.config.get(k)}"
            for k in knobs
            if va.best.config.get(k) != vb.best.config.get(k)
        ]
        differences.append("Best config changed (B -> A): " + "; ".join(parts) + ".")
    elif va.best and vb.best:
        differences.append("Both runs chose the same config.")
    pkgs_a = a.provenance.environment.get("packages") or {}
    pkgs_b = b.provenance.environment.get("packages") or {}
    changed_pkgs = sorted(k for k in set(pkgs_a) | set(pkgs_b) if pkgs_a.get(k) != pkgs_b.get(k))
    if changed_pkgs:
        differences.append(
            "Package versions differ: "
            + ", ".join(f"{k} {pkgs_b.get(k, '-')} -> {pkgs_a.get(k, '-')}" for k in changed_pkgs)
            + "."
        )
    hash_a = a.provenance.environment.get("scenario_hash")
    hash_b = b.provenance.environment.get("scenario_hash")
    if hash_a and hash_b and hash_a != hash_b:
        if hash_version(hash_a) != hash_version(hash_b):
            differences.append(
                f"The scenario hashes ({hash_a} vs {hash_b}) were made by perfsweep versions "
                "that hash scenarios differently: they cannot tell whether the scenarios differ."
            )
        else:
            differences.append(
                f"The scenarios differ (hash {hash_a} vs {hash_b}): budgets, space or traffic "
                "changed."
            )
    for name, r in (("A", a), ("B", b)):
        if r.verdict.warnings:
            differences.append(f"Run {name} has {len(r.verdict.warnings)} warning(s); see below.")
    diff = None
    if a.configs.best is not None and b.configs.best is not None:
        diff = "".join(
            difflib.unified_diff(
                b.configs.best.splitlines(keepends=True),
                a.configs.best.splitlines(keepends=True),
                fromfile="B best/config.pbtxt",
                tofile="A best/config.pbtxt",
            )
        )
    return Comparison(
        a=_identity(a),
        b=_identity(b),
        rows=tuple(rows),
        differences=tuple(differences),
        best_config_diff=diff,
    )


# --------------------------------------------------------------------------------------------------
# Figures and page


def tradeoff_overlay(a: ReportRecord, b: ReportRecord) -> Figure | None:
    """Both runs' trials on one throughput-vs-p99 plot, bests marked."""
    return styled(lambda: _tradeoff_overlay(a, b))


def _tradeoff_overlay(a: ReportRecord, b: ReportRecord) -> Figure | None:
    runs = [("A", a, BEST), ("B", b, SECONDARY)]
    if not any(t.throughput_rps is not None for _, r, _ in runs for t in r.trials):
        return None
    fig, (ax,) = new_figure(6.8, 4.2)
    for name, r, color in runs:
        pts = [t for t in r.trials if t.throughput_rps is not None and t.p99_ms is not None]
        ok = [t for t in pts if t.meets_goals]
        bad = [t for t in pts if not t.meets_goals]
        ax.scatter(
            [t.p99_ms for t in ok],
            [t.throughput_rps for t in ok],
            s=20,
            color=color,
            alpha=0.8,
            label=f"run {name} (meets goals)",
        )
        ax.scatter(
            [t.p99_ms for t in bad],
            [t.throughput_rps for t in bad],
            s=20,
            marker="x",
            color=color,
            alpha=0.6,
            label=f"run {name} (misses goals)",
        )
        best = r.verdict.best
        if best is not None:
            ax.scatter(
                [best.p99_ms],
                [best.throughput_rps],
                s=180,
                marker="*",
                color=color,
                edgecolor="black",
                linewidth=0.6,
                zorder=5,
                label=f"run {name} best",
            )
    for _, r, _ in runs:
        goal = r.verdict.goals.get("p99_ms")
        if goal:
            ax.axvline(float(goal), color=INFEASIBLE, linestyle="--", linewidth=1)
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("throughput (req/s)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize=8, frameon=False)
    return Figure(
        "compare_tradeoff",
        to_svg(fig, "compare_tradeoff"),
        "Trials of both runs, throughput against p99, with each run's best marked.",
    )


def curves_overlay(a: ReportRecord, b: ReportRecord) -> Figure | None:
    """The best config's load curve of each run."""
    curves: list[LoadCurve] = []
    for name, r in (("A", a), ("B", b)):
        for c in r.load_curves:
            if c.role == "best":
                curves.append(dataclasses.replace(c, role=f"run {name} best"))
    goal = a.verdict.goals.get("p99_ms")
    return styled(
        lambda: load_curves_figure(
            curves, goal, name="compare_curves", palette=(BEST, SECONDARY), by_role=False
        )
    )


def render_comparison(comparison: Comparison, a: ReportRecord, b: ReportRecord) -> str:
    """The comparison page."""
    from analyzer.report.render import _version, diff_lines, render_page

    data = {"comparison": comparison.to_dict(), "a": a.to_dict(), "b": b.to_dict()}
    figures: Mapping[str, Figure | None] = {
        "compare_tradeoff": tradeoff_overlay(a, b),
        "compare_curves": curves_overlay(a, b),
    }
    return render_page(
        "compare.html.j2",
        data,
        figures,
        {
            "c": comparison.to_dict(),
            "ra": a.to_dict(),
            "rb": b.to_dict(),
            "diff_lines": diff_lines(comparison.best_config_diff),
            "version": _version(),
        },
    )
