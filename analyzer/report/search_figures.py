"""The report's figures of the search: its progress (section 3: best so far, parameter
importance, slices) and the prediction against the measurement (3b: predicted vs measured,
the predicted landscape).
"""

from __future__ import annotations

import math
from typing import Any

from analyzer.report.prediction import CLOSE
from analyzer.report.record import KNOBS, ReportRecord
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
