"""The report's figures of the server: why the winner wins (section 4: latency breakdown, batch
sizes), the load curves (5) and the time series of a run (6).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from analyzer.report.record import LoadCurve, ReportRecord, TimeSeries
from analyzer.report.svg import (
    BASELINE,
    BEST,
    FEASIBLE,
    INFEASIBLE,
    SECONDARY,
    Figure,
    new_figure,
    styled,
    to_svg,
)


def latency_breakdown(record: ReportRecord) -> Figure | None:
    """Stacked bars: server queue and compute phases per request, baseline vs best."""
    return styled(lambda: _latency_breakdown(record))


def _latency_breakdown(record: ReportRecord) -> Figure | None:
    views = list(record.breakdown)
    if not views:
        return None
    fig, (ax,) = new_figure(6.8, 0.9 + 0.6 * len(views))
    phases = (
        ("queue", "queue_us", "#fdae61"),
        ("compute input", "compute_input_us", "#abd9e9"),
        ("compute infer", "compute_infer_us", "#2c7bb6"),
        ("compute output", "compute_output_us", "#8073ac"),
    )
    labels = [f"{v.role} @ {v.measured_at_rps:.0f} req/s" for v in views]
    left = [0.0] * len(views)
    for name, attr, color in phases:
        widths = [getattr(v, attr) / 1000.0 for v in views]
        ax.barh(labels, widths, left=left, color=color, label=name)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in enumerate(left):
        ax.text(total, y, f"  {total:.2f} ms", va="center", fontsize=8)
    ax.set_xlabel("server time per request (ms, averages from the statistics extension)")
    ax.set_xlim(0, max(left) * 1.25 if max(left) > 0 else 1)
    ax.grid(axis="y", visible=False)
    ax.legend(loc="lower right", fontsize=8, frameon=False, ncols=4, bbox_to_anchor=(1, 1))
    alt = "Server-side time per request split into queue and compute phases: " + "; ".join(
        f"{v.role} queue {v.queue_us / 1000:.2f} ms, infer {v.compute_infer_us / 1000:.2f} ms"
        for v in views
    )
    return Figure("latency_breakdown", to_svg(fig, "latency_breakdown"), alt)


def batch_sizes(record: ReportRecord) -> Figure | None:
    """Executions per batch size (share of all executions), baseline vs best."""
    return styled(lambda: _batch_sizes(record))


def _batch_sizes(record: ReportRecord) -> Figure | None:
    views = [v for v in record.breakdown if v.batch_sizes]
    if not views:
        return None
    sizes = sorted({s for v in views for s in v.batch_sizes})
    fig, (ax,) = new_figure(6.8, 3.0)
    width = 0.8 / len(views)
    positions = range(len(sizes))
    for i, v in enumerate(views):
        total = sum(v.batch_sizes.values()) or 1
        ax.bar(
            [p + (i - (len(views) - 1) / 2) * width for p in positions],
            [100.0 * v.batch_sizes.get(s, 0) / total for s in sizes],
            width=width,
            color=BEST if v.role == "best" else BASELINE,
            label=f"{v.role} (mean batch {v.avg_batch_size:.1f})",
        )
    ax.set_xticks(list(positions), [str(s) for s in sizes])
    ax.set_xlabel("batch size executed")
    ax.set_ylabel("share of executions (%)")
    ax.legend(loc="best", fontsize=8, frameon=False)
    alt = "Distribution of executed batch sizes: " + "; ".join(
        f"{v.role} mean {v.avg_batch_size:.1f}" for v in views
    )
    return Figure("batch_sizes", to_svg(fig, "batch_sizes"), alt)


def load_curves(record: ReportRecord) -> Figure | None:
    """Throughput and p99 against offered load for baseline and best, with the knee marked."""
    return styled(
        lambda: load_curves_figure(record.load_curves, record.verdict.goals.get("p99_ms"))
    )


def load_curves_figure(
    curves: Sequence[LoadCurve],
    goal: float | None,
    name: str = "load_curves",
    palette: Sequence[str] = (BASELINE, BEST, FEASIBLE, SECONDARY),
    by_role: bool = True,
) -> Figure | None:
    """Throughput and p99 against offered load for ``curves`` (single run or comparison).

    Args:
        curves: The load curves to draw.
        goal: The p99 goal (ms), drawn as a line.
        name: Figure name (``data-figure`` and SVG id prefix).
        palette: Colours in curve order.
        by_role: Colour baseline grey and best green whatever the palette says.
    """
    curves = [c for c in curves if c.points]
    if not curves:
        return None
    fig, (ax_t, ax_p) = new_figure(8.8, 3.4, ncols=2)
    for i, c in enumerate(curves):
        color = palette[i % len(palette)]
        if by_role:  # single run: the report's role colours; comparisons: one colour per curve
            color = {"baseline": BASELINE, "best": BEST}.get(c.role, color)
        xs = [p.offered_rps for p in c.points]
        label = c.role
        ax_t.plot(
            xs, [p.throughput_rps for p in c.points], marker="o", ms=3, color=color, label=label
        )
        ax_p.plot(
            xs,
            [min(p.p99_ms, (goal or math.inf) * 5) for p in c.points],
            marker="o",
            ms=3,
            color=color,
            label=label,
        )
        if c.capacity_rps > 0:  # the knee; a config that met the goals nowhere has none
            for ax in (ax_t, ax_p):
                ax.axvline(c.capacity_rps, color=color, linestyle=":", linewidth=1)
        bad = [p for p in c.points if not p.meets_goals]
        ax_p.scatter(
            [p.offered_rps for p in bad],
            [min(p.p99_ms, (goal or math.inf) * 5) for p in bad],
            marker="x",
            color=INFEASIBLE,
            s=30,
            zorder=5,
        )
    top = max(p.offered_rps for c in curves for p in c.points)
    ax_t.plot(
        [0, top], [0, top], color="#bbbbbb", linewidth=0.8, linestyle="--", label="served = offered"
    )
    if goal:
        ax_p.axhline(float(goal), color=INFEASIBLE, linestyle="--", linewidth=1, label="p99 goal")
        ax_p.set_ylim(0, float(goal) * 5.2)
    ax_t.set_xlabel("offered load (req/s)")
    ax_t.set_ylabel("throughput (req/s)")
    ax_p.set_xlabel("offered load (req/s)")
    ax_p.set_ylabel("p99 (ms, clipped at 5x goal)")
    ax_t.legend(loc="upper left", fontsize=8, frameon=False)
    ax_p.legend(loc="upper left", fontsize=8, frameon=False)
    alt = "Throughput and p99 against offered load: " + "; ".join(
        f"{c.role} capacity {c.capacity_rps:.0f} req/s" for c in curves
    )
    return Figure(name, to_svg(fig, name), alt)


def time_series(record: ReportRecord) -> Figure | None:
    """Per-window throughput and p99 of each recorded series.

    Colour says which config (best green, baseline grey), line style which run (validation solid,
    search dashed), and an ``x`` marker a measurement that failed its self-checks.
    """
    best = record.verdict.best.trial_number if record.verdict.best else None
    return styled(
        lambda: _time_series(record.time_series, record.verdict.goals.get("p99_ms"), best)
    )


def _time_series(
    series: Sequence[TimeSeries], goal: float | None, best_number: int | None
) -> Figure | None:
    series = [s for s in series if s.points]
    if not series:
        return None
    fig, (ax_t, ax_p) = new_figure(8.8, 3.2, ncols=2)
    others = [FEASIBLE, SECONDARY, "#8073ac", "#b35806"]
    for i, s in enumerate(series):
        if s.trial_number < 0:
            color = BASELINE
        elif s.trial_number == best_number:
            color = BEST
        else:
            color = others[i % len(others)]
        style = "-" if s.source == "validation" else "--"
        # Labels are built by the record from numbers and roles only (no run strings).
        label = s.label + (" (flagged)" if s.flags else "")
        marker = "x" if s.flags else "o"
        xs = [p.end_s for p in s.points]
        for ax, ys in (
            (ax_t, [p.throughput_rps for p in s.points]),
            (ax_p, [p.p99_ms for p in s.points]),
        ):
            ax.plot(xs, ys, style, marker=marker, ms=4, color=color, label=label)
    if goal:
        ax_p.axhline(float(goal), color=INFEASIBLE, linestyle="--", linewidth=1, label="p99 goal")
    for ax, name in ((ax_t, "throughput (req/s)"), (ax_p, "p99 (ms)")):
        ax.set_xlabel("time into the measurement (s, window ends)")
        ax.set_ylabel(name)
        ax.set_ylim(bottom=0)
    handles, labels = ax_p.get_legend_handles_labels()
    # One legend under both panels: inside, it would hide the lines it explains.
    fig.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncols=min(3, len(labels)),
        fontsize=8,
        frameon=False,
    )
    alt = f"Per-window throughput and p99 of {len(series)} measurement(s)."
    return Figure("time_series", to_svg(fig, "time_series"), alt)
