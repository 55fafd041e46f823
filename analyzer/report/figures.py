"""Matplotlib figures of a report record, as inline SVG text.

Every function takes the record (data only) and returns a :class:`Figure`, or None when the data
for it was not recorded. Figures never contain strings from the run (model names, scenario
values): titles and captions with such strings live in the HTML, where the template escapes
them. Matplotlib escapes SVG text itself as well.

This module holds the throughput-vs-p99 figure (section 2) and :func:`report_figures`, which
collects them all; the others live beside it (``search_figures``: sections 3 and 3b;
``server_figures``: 4 to 6), and :class:`~analyzer.report.svg.Figure` with the style in ``svg``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from analyzer.config.objective import objective_for
from analyzer.report.record import ReportRecord, TrialPoint
from analyzer.report.search_figures import (
    best_so_far,
    importance,
    landscape,
    predicted_vs_measured,
    slices,
)
from analyzer.report.server_figures import batch_sizes, latency_breakdown, load_curves, time_series
from analyzer.report.svg import (
    BASELINE,
    BEST,
    FEASIBLE,
    INFEASIBLE,
    Figure,
    new_figure,
    styled,
    to_svg,
)
from analyzer.report.tokens import tokens_figure


def throughput_vs_p99(record: ReportRecord) -> Figure | None:
    """Every complete trial: p99 (x) against throughput (y), SLO line, front, baseline and best."""
    return styled(lambda: _throughput_vs_p99(record))


def _throughput_vs_p99(record: ReportRecord) -> Figure | None:
    points = [t for t in record.trials if t.throughput_rps is not None and t.p99_ms is not None]
    if not points:
        return None
    front_objective = objective_for(record.verdict.objective).multi
    if front_objective:
        # The front trades capacity against p99 at the fixed reference load: plot that p99.
        points = [
            dataclasses.replace(t, p99_ms=t.reference_p99_ms)
            for t in points
            if t.reference_p99_ms is not None
        ]
    fig, (ax,) = new_figure(6.8, 4.2)
    goal = record.verdict.goals.get("p99_ms")
    feasible = [t for t in points if t.meets_goals and t.number >= 0]
    infeasible = [t for t in points if not t.meets_goals and t.number >= 0]
    ax.scatter(
        [t.p99_ms for t in feasible],
        [t.throughput_rps for t in feasible],
        s=22,
        color=FEASIBLE,
        alpha=0.8,
        label=f"meets goals ({len(feasible)})",
    )
    ax.scatter(
        [t.p99_ms for t in infeasible],
        [t.throughput_rps for t in infeasible],
        s=26,
        marker="x",
        color=INFEASIBLE,
        alpha=0.8,
        label=f"misses goals ({len(infeasible)})",
    )
    front = sorted((t for t in points if t.on_front), key=lambda t: t.p99_ms or 0.0)
    if front:
        ax.step(
            [t.p99_ms for t in front],
            [t.throughput_rps for t in front],
            where="post",
            color=FEASIBLE,
            linewidth=1,
            alpha=0.7,
            label="Pareto front",
        )
    if goal and not front_objective:
        ax.axvline(float(goal), color=INFEASIBLE, linestyle="--", linewidth=1, label="p99 goal")
    for role, result in (("baseline", record.verdict.baseline), ("best", record.verdict.best)):
        if result is not None:
            _mark(ax, points, result.trial_number, role)
    ax.set_xlabel(
        "p99 at the reference load (ms)"
        if front_objective
        else "p99 latency at the trial's operating point (ms)"
    )
    ax.set_ylabel("throughput (req/s)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize=8, frameon=False)
    alt = (
        f"Scatter of {len(points)} measured configs, throughput against p99 latency; "
        f"{len(feasible)} meet the goals, {len(infeasible)} miss them."
    )
    return Figure("throughput_vs_p99", to_svg(fig, "throughput_vs_p99"), alt)


def _mark(ax: Any, points: Sequence[TrialPoint], number: int, role: str) -> None:
    match = [t for t in points if t.number == number]
    if not match:
        return
    t = match[0]
    color = BEST if role == "best" else BASELINE
    marker = "*" if role == "best" else "s"
    ax.scatter(
        [t.p99_ms],
        [t.throughput_rps],
        s=180 if role == "best" else 70,
        marker=marker,
        color=color,
        edgecolor="black",
        linewidth=0.6,
        zorder=5,
        label=role,
    )


def report_figures(record: ReportRecord) -> dict[str, Figure | None]:
    """Every figure of the single-run report, keyed by name (None: data not recorded)."""
    return {
        "throughput_vs_p99": throughput_vs_p99(record),
        "best_so_far": best_so_far(record),
        "importance": importance(record),
        "slices": slices(record),
        "predicted_vs_measured": predicted_vs_measured(record),
        "landscape": landscape(record),
        "latency_breakdown": latency_breakdown(record),
        "batch_sizes": batch_sizes(record),
        "load_curves": load_curves(record),
        "time_series": time_series(record),
        "tokens": tokens_figure(record.tokens),
    }
