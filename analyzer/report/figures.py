"""Matplotlib figures of a report record, as inline SVG text.

Every function takes the record (data only) and returns a :class:`Figure`, or None when the data
for it was not recorded. Figures never contain strings from the run (model names, scenario
values): titles and captions with such strings live in the HTML, where the template escapes
them. Matplotlib escapes SVG text itself as well.

Every id inside a figure's SVG is prefixed with the figure's name, so the ids matplotlib generates
(``axes_1``, clip paths, markers) do not collide when several figures sit inline in one page; a
fixed ``svg.hashsalt`` keeps the output deterministic.
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: reports are rendered on servers and in CI

import matplotlib.pyplot as plt
from matplotlib.figure import Figure as MplFigure

from analyzer.config.objective import objective_for
from analyzer.report.prediction import CLOSE
from analyzer.report.record import (
    KNOBS,
    LoadCurve,
    ReportRecord,
    TimeSeries,
    TrialPoint,
)

#: Colours: baseline grey, best green, other feasible blue, infeasible red (colour-blind safe-ish).
BASELINE = "#6b6b6b"
BEST = "#1a9850"
FEASIBLE = "#2c7fb8"
INFEASIBLE = "#d7301f"
SECONDARY = "#fdae61"

_STYLE: Any = {
    "figure.dpi": 100,
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "none",  # text stays text: smaller files, selectable labels
}


@dataclass(frozen=True)
class Figure:
    """One rendered figure.

    Attributes:
        name: Stable identifier (``data-figure`` attribute in the HTML).
        svg: The ``<svg>`` element (no XML prolog).
        alt: What the figure shows, for screen readers and text browsers.
    """

    name: str
    svg: str
    alt: str


def to_svg(fig: MplFigure, name: str) -> str:
    """Serialise and close a figure; the SVG's ids are salted with ``name``."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": name}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return _prefix_ids(text[text.index("<svg") :], name)


_ID_REF = re.compile(r'(id="|href="#|url\(#)([^"()]+)')


def _prefix_ids(svg: str, prefix: str) -> str:
    """Prefix every id (and every reference to one) so inline figures never share an id.

    Matplotlib names groups ``figure_1``, ``axes_1``, ``PathCollection_1`` in every figure, which
    would repeat across several inline SVGs in one page.
    """
    ids = set(re.findall(r'id="([^"]+)"', svg))

    def swap(match: re.Match[str]) -> str:
        head, name = match.groups()
        return f"{head}{prefix}-{name}" if name in ids else match.group(0)

    return _ID_REF.sub(swap, svg)


def new_figure(width: float = 6.4, height: float = 3.6, ncols: int = 1) -> tuple[MplFigure, list]:
    """A figure with ``ncols`` axes in one row, in the report's style."""
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    return fig, list(axes[0])


def styled(build: Callable[[], Figure | None]) -> Figure | None:
    """Run a figure builder under the report's matplotlib style."""
    with plt.rc_context(_STYLE):
        return build()


# --------------------------------------------------------------------------------------------------
# 2. Throughput vs p99


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


# --------------------------------------------------------------------------------------------------
# 3. Search progress


def best_so_far(record: ReportRecord) -> Figure | None:
    """Each trial's objective value and the best feasible value so far, by trial number."""
    return styled(lambda: _best_so_far(record))


def _best_so_far(record: ReportRecord) -> Figure | None:
    progress = record.progress
    pts = [p for p in progress.points if p.value is not None]
    if not pts:
        return None
    fig, (ax,) = new_figure(6.8, 3.2)
    ax.scatter(
        [p.number for p in pts if p.meets_goals],
        [p.value for p in pts if p.meets_goals],
        s=14,
        color=FEASIBLE,
        label="trial (meets goals)",
    )
    ax.scatter(
        [p.number for p in pts if not p.meets_goals],
        [p.value for p in pts if not p.meets_goals],
        s=16,
        marker="x",
        color=INFEASIBLE,
        label="trial (misses goals)",
    )
    steps = [p for p in progress.points if p.best_so_far is not None]
    if steps:
        ax.step(
            [p.number for p in steps],
            [p.best_so_far for p in steps],
            where="post",
            color=BEST,
            linewidth=1.6,
            label="best so far",
        )
    base = record.verdict.baseline
    if base is not None and base.meets_goals:
        value = base.p99_ms if not progress.higher_is_better else base.throughput_rps
        ax.axhline(value, color=BASELINE, linestyle=":", linewidth=1, label="baseline")
    ax.set_xlabel("trial number")
    ax.set_ylabel("p99 (ms)" if not progress.higher_is_better else "throughput (req/s)")
    ax.legend(loc="best", fontsize=8, frameon=False)
    alt = f"Objective value of {len(pts)} trials by trial number, with the best so far as a step line."
    return Figure("best_so_far", to_svg(fig, "best_so_far"), alt)


def importance(record: ReportRecord) -> Figure | None:
    """Horizontal bars: Optuna's parameter importance per knob."""
    return styled(lambda: _importance(record))


def _importance(record: ReportRecord) -> Figure | None:
    values = record.progress.importances
    if not values:
        return None
    names = list(values)[::-1]
    fig, (ax,) = new_figure(6.0, 0.5 + 0.45 * len(names))
    ax.barh(names, [values[n] for n in names], color=FEASIBLE)
    ax.set_xlabel("importance (PED-ANOVA, share of total)")
    ax.set_xlim(0, max(1.0, max(values.values())))
    ax.grid(axis="y", visible=False)
    alt = "Parameter importance: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items())
    return Figure("importance", to_svg(fig, "importance"), alt)


def slices(record: ReportRecord) -> Figure | None:
    """One panel per knob: the knob's value against the objective for every trial."""
    return styled(lambda: _slices(record))


def _slices(record: ReportRecord) -> Figure | None:
    knobs = [k for k, _ in KNOBS if k in record.progress.slices]
    if not knobs:
        return None
    fig, axes = new_figure(3.0 * len(knobs), 2.8, ncols=len(knobs))
    for ax, knob in zip(axes, knobs, strict=True):
        rows = record.progress.slices[knob]
        # Knob values form a small ladder (powers of two, a geometric delay ladder): one evenly
        # spaced slot per value tried, labelled with the value, reads better than any scale.
        values = sorted({r.knob_value for r in rows})
        slot = {v: i for i, v in enumerate(values)}
        for ok, marker, color in ((True, "o", FEASIBLE), (False, "x", INFEASIBLE)):
            picked = [r for r in rows if r.meets_goals == ok]
            ax.scatter(
                [slot[r.knob_value] for r in picked],
                [r.objective for r in picked],
                s=16,
                marker=marker,
                color=color,
            )
        step = max(1, len(values) // 8)
        ax.set_xticks(
            list(range(0, len(values), step)), [f"{v:g}" for v in values[::step]], fontsize=8
        )
        ax.set_xlim(-0.5, len(values) - 0.5)
        ax.set_xlabel("preferred sizes set" if knob == "preferred_batch_size" else knob)
    axes[0].set_ylabel("throughput (req/s)" if record.progress.higher_is_better else "p99 (ms)")
    alt = "Each knob's value against the objective, one panel per knob: " + ", ".join(knobs)
    return Figure("slices", to_svg(fig, "slices"), alt)


# --------------------------------------------------------------------------------------------------
# 4. Why the winner wins


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


# --------------------------------------------------------------------------------------------------
# 5. Load curves


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


# --------------------------------------------------------------------------------------------------
# 6. Time series


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


# --------------------------------------------------------------------------------------------------
# 3b. Prediction against measurement


def predicted_vs_measured(record: ReportRecord) -> Figure | None:
    """Predicted (y) against measured (x) capacity per measured config, y = x, a +-10 % band,
    each prediction's band as an error bar."""
    return styled(lambda: _predicted_vs_measured(record))


def _predicted_vs_measured(record: ReportRecord) -> Figure | None:
    check = record.prediction
    if check is None or not check.points:
        return None
    fig, (ax,) = new_figure(7.2, 4.6)
    top = max(max(p.measured_rps, p.high_rps, p.predicted_rps) for p in check.points) * 1.08
    top = max(top, 1.0)  # all-zero capacities still get axes
    line = [0.0, top]
    ax.fill_between(
        line,
        [x * (1 - CLOSE) for x in line],
        [x * (1 + CLOSE) for x in line],
        color="#cccccc",
        alpha=0.45,
        linewidth=0,
        label=f"within {100 * CLOSE:.0f} %",
    )
    ax.plot(line, line, color="#777777", linewidth=1, linestyle="--", label="predicted = measured")
    best = record.verdict.best.trial_number if record.verdict.best else None
    groups = (
        ("o", FEASIBLE, "inside its band", lambda p: p.bracketed and p.in_band),
        ("D", INFEASIBLE, "outside its band", lambda p: p.bracketed and not p.in_band),
        (">", SECONDARY, "measured is a lower bound", lambda p: not p.bracketed),
    )
    for marker, color, name, belongs in groups:
        picked = [p for p in check.points if belongs(p)]
        if not picked:
            continue
        ax.errorbar(
            [p.measured_rps for p in picked],
            [p.predicted_rps for p in picked],
            yerr=[
                [max(p.predicted_rps - p.low_rps, 0.0) for p in picked],
                [max(p.high_rps - p.predicted_rps, 0.0) for p in picked],
            ],
            fmt=marker,
            ms=4,
            color=color,
            ecolor=color,
            elinewidth=0.8,
            capsize=2,
            alpha=0.85,
            label=f"{name} ({len(picked)})",
        )
    for p in check.points:
        if p.trial_number == best or p.trial_number < 0:
            role = "best" if p.trial_number == best else "baseline"
            ax.scatter(
                [p.measured_rps],
                [p.predicted_rps],
                s=170 if role == "best" else 70,
                marker="*" if role == "best" else "s",
                color=BEST if role == "best" else BASELINE,
                edgecolor="black",
                linewidth=0.6,
                zorder=5,
                label=role,
            )
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("measured capacity at the goal (req/s)")
    ax.set_ylabel("predicted capacity at the goal (req/s)")
    # Beside the axes: inside, it would hide the points in the corner it takes.
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    alt = f"Predicted against measured capacity of {len(check.points)} configs. {check.summary}"
    return Figure("predicted_vs_measured", to_svg(fig, "predicted_vs_measured"), alt)


def landscape(record: ReportRecord) -> Figure | None:
    """Predicted capacity over max batch size x queue delay, one heat map per instance count,
    the measured configs marked on it."""
    return styled(lambda: _landscape(record))


def _landscape(record: ReportRecord) -> Figure | None:
    space = record.landscape
    if space is None or not space.cells:
        return None
    panels = space.instance_counts
    xs, ys = space.max_batch_sizes, space.queue_delays_us
    col = {v: i for i, v in enumerate(xs)}
    row = {v: i for i, v in enumerate(ys)}
    width = max(3.2, 0.42 * len(xs) + 1.4)
    fig, axes = new_figure(width * len(panels) + 0.8, max(2.8, 0.34 * len(ys) + 1.4), len(panels))
    vmax = max(c.capacity_rps for c in space.cells) or 1.0
    image = None
    for ax, instances in zip(axes, panels, strict=True):
        grid = [[math.nan] * len(xs) for _ in ys]
        for c in space.cells:
            if c.instance_count == instances:
                grid[row[c.max_queue_delay_us]][col[c.max_batch_size]] = c.capacity_rps
        image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis", vmin=0.0, vmax=vmax)
        ax.grid(False)
        ax.set_xticks(range(len(xs)), [str(v) for v in xs], fontsize=7)
        step = max(1, len(ys) // 10)
        ax.set_yticks(list(range(0, len(ys), step)), [str(v) for v in ys[::step]], fontsize=7)
        ax.set_xlabel("max batch size")
        ax.set_title(f"{instances} instance(s)", fontsize=9)
        b = space.best
        if b.instance_count == instances:
            ax.scatter(
                [col[b.max_batch_size]],
                [row[b.max_queue_delay_us]],
                s=120,
                marker="s",
                facecolor="none",
                edgecolor="black",
                linewidth=1.6,
                label="predicted best",
            )
        for ok, marker, color, name in (
            (True, "o", "white", "measured, meets goals"),
            (False, "x", INFEASIBLE, "measured, misses goals"),
        ):
            marks = [
                m
                for m in space.marks
                if m.instance_count == instances and m.meets_goals == ok and m.role != "best"
            ]
            if marks:
                ax.scatter(
                    [col[m.max_batch_size] for m in marks],
                    [row[m.max_queue_delay_us] for m in marks],
                    s=26,
                    marker=marker,
                    color=color,
                    edgecolor="black" if ok else None,
                    linewidth=0.6 if ok else 1.4,
                    label=name,
                )
        for m in space.marks:
            if m.instance_count == instances and m.role == "best":
                ax.scatter(
                    [col[m.max_batch_size]],
                    [row[m.max_queue_delay_us]],
                    s=170,
                    marker="*",
                    color=BEST,
                    edgecolor="black",
                    linewidth=0.6,
                    zorder=5,
                    label="measured best",
                )
    axes[0].set_ylabel("max queue delay (µs)")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.85, label="predicted capacity (req/s)")
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(
        list(handles.values()),
        list(handles),
        loc="upper center",
        bbox_to_anchor=(0.45, 0.0),
        ncols=min(4, len(handles)) or 1,
        fontsize=8,
        frameon=False,
    )
    b = space.best
    alt = (
        f"Predicted capacity of {space.configs} configs over max batch size and queue delay, "
        f"one panel per instance count ({', '.join(map(str, panels))}); predicted best "
        f"{b.capacity_rps:.0f} req/s at max batch size {b.max_batch_size}, delay "
        f"{b.max_queue_delay_us} µs, {b.instance_count} instance(s); "
        f"{len(space.marks)} measured config(s) marked."
    )
    return Figure("landscape", to_svg(fig, "landscape"), alt)


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
    }
