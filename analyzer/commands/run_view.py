"""What ``perfsweep run`` shows: the live view of the trials while it runs (a terminal's
progress display, or a plain line per event for a log) and the lines and table it ends with.

How much it shows is the run's :class:`Verbosity`: ``--quiet`` nothing while it runs (only the
answer at the end), ``--verbose`` also each step of each measurement as it starts and every
trial at the end."""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from analyzer.config.knobs import EngineKnobs
from analyzer.config.pipeline import TrialKnobs, knob_cells, knobs_from_dict
from analyzer.config.scenario import Scenario
from analyzer.config.traffic import TrafficMode
from analyzer.measure.goals import classes_text
from analyzer.measure.specs import Goals
from analyzer.report.record import StageBreakdown
from analyzer.report.series import limiting_stage, stage_breakdown
from analyzer.rundir.batching import trial_batches
from analyzer.rundir.trial_record import TrialRecord
from analyzer.sweep.state import SweepObserver, SweepOutcome
from analyzer.target.server_stats import cache_hit_ratio, cache_hits_text


def start_line(run_dir: Path, scenario: Scenario, target: dict[str, Any]) -> str:
    """The run's first line: model, target, goal, the traffic's shape when not Poisson."""
    mix = scenario.mix()
    what = f"models {', '.join(mix)} (served together)" if mix else f"model {scenario.model.name}"
    g = scenario.goals
    goal = (
        Goals(math.inf, ttft_p99_ms=g.ttft_p99_ms, itl_p99_ms=g.itl_p99_ms).describe()
        if g.ttft_p99_ms is not None or g.itl_p99_ms is not None
        else f"p99 <= {g.p99_ms:g} ms"
    )
    line = f"perfsweep run: {what} on {target.get('device')} at {target.get('url')}; goal {goal}"
    traffic = scenario.traffic
    if traffic.mode is TrafficMode.RATE and len(traffic.shapes) > 1:
        shapes = "; ".join(a.describe() for a in traffic.arrival_processes())
        line += f"; each config's worst capacity under: {shapes}"
    elif traffic.mode is TrafficMode.RATE and traffic.arrival != "poisson":
        line += f"; arrivals {traffic.arrival_process().describe()}"
    return f"{line}; results in {run_dir}"


def ceiling_note(summary: SweepOutcome, scenario: Scenario) -> str | None:
    """What the console says first when the best config served the highest rate offered: its
    capacity is a lower bound, set by the load this host can offer, not by the server."""
    best, ceiling = summary.best, scenario.traffic.max_rate_rps
    if scenario.traffic.mode is not TrafficMode.RATE or best is None or not best.meets_goals:
        return None
    if best.throughput_rps < ceiling * (1 - 1e-9):
        return None
    return (
        f"ceiling: the best config met the goals at every rate offered, up to "
        f"traffic.max_rate_rps ({ceiling:g} req/s): its capacity is at least that, and the "
        "limit is the load this host offers, not the server (raise traffic.max_rate_rps, or add "
        "generator processes with --workers)"
    )


def latency_text(r: TrialRecord) -> str:
    """``p99 12.3 ms``; a generative trial's token figures at its operating point instead:
    ``TTFT p99 120.0 ms, ITL p99 18.2 ms, 310 tok/s, goodput 9.7 req/s``."""
    f = r.token_figures()
    if not f:
        return f"p99 {r.p99_ms:.1f} ms"
    text = (
        f"TTFT p99 {f['ttft_p99_ms']:.1f} ms, ITL p99 {f['itl_p99_ms']:.1f} ms, "
        f"{f['output_tokens_per_s']:.0f} tok/s"
    )
    if f["goodput_rps"] is not None:
        text += f", goodput {f['goodput_rps']:.1f} req/s"
    return text


def _batches(r: TrialRecord) -> str:
    """``, mean batch 1.03 of 8``: the batches the trial's config formed at its operating point
    (empty when it cannot batch or the server reported no statistics)."""
    t = trial_batches(r)
    return "" if t is None else f", mean batch {t.mean_batch_size:.2f} of {t.max_batch_size}"


def _rps(r: TrialRecord, unit: str = "") -> str:
    """A throughput as the console prints it, with the response cache's hit ratio beside it when
    the measurement was served partly from the cache (so no one mistakes a cache for a faster
    model)."""
    point = r.operating_point()
    hits = cache_hits_text(cache_hit_ratio(point.server if point is not None else None))
    return f"{r.throughput_rps:.1f}{unit}" + (f" ({hits})" if hits else "")


class Verbosity(enum.Enum):
    """How much ``perfsweep run`` prints (``--quiet``, default, ``--verbose``)."""

    QUIET = "quiet"
    NORMAL = "normal"
    VERBOSE = "verbose"


class QuietView(SweepObserver):
    """The live view of ``--quiet``: nothing while the run goes (errors still reach stderr)."""

    def __enter__(self) -> QuietView:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def trials_table(rows: Sequence[TrialRecord], title: str = "finished trials") -> Table:
    """One row per trial: its number, where its config came from, the config, its rate, p99 and
    whether it met the goals (or why it failed)."""
    table = Table(title=title, expand=False, show_lines=False)
    for name in ("#", "source", "config", "rps", "p99 ms", "goals"):
        table.add_column(name, justify="right" if name in ("#", "rps", "p99 ms") else "left")
    for r in rows:
        table.add_row(
            "base" if r.number < 0 else str(r.number),
            r.source,
            escape(r.config.label()),
            _rps(r) if r.state == "complete" else "-",
            _p99_cell(r) if r.state == "complete" else "-",
            ("[green]met" if r.meets_goals else "[red]missed")
            if r.state == "complete"
            else f"[red]{r.state}: {escape((r.failure or '')[:60])}",
        )
    return table


def _p99_cell(r: TrialRecord) -> str:
    """The p99 column: ``12.3``; a generative trial's ``TTFT/ITL`` p99 (``120.0/18.2``)."""
    f = r.token_figures()
    if not f:
        return f"{r.p99_ms:.1f}"
    return f"{f['ttft_p99_ms']:.1f}/{f['itl_p99_ms']:.1f}"


def trials_text(counts: Mapping[str, int]) -> str:
    """``8 complete, 1 failed`` from a summary's trial counts (the kinds with none left out)."""
    parts = [f"{counts.get(k, 0)} {k}" for k in ("complete", "failed", "interrupted")]
    shown = [part for part in parts if not part.startswith("0 ")] or ["none"]
    return ", ".join(shown)


class LiveView(SweepObserver):
    """Progress with ETA, the current trial, a table of finished trials and the best so far;
    ``verbose``: each step of a measurement (capacity search, warm-up...) printed as it starts."""

    def __init__(self, console: Console, budget: int, *, verbose: bool = False) -> None:
        self.console = console
        self.verbose = verbose
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.progress.add_task("trials", total=budget)
        self.current = ""
        self.phase = ""
        self.rows: list[TrialRecord] = []
        self.best: TrialRecord | None = None
        self.live = Live(self._render(), console=console, refresh_per_second=2, transient=False)
        self.started = False

    def __enter__(self) -> LiveView:
        return self  # the live display starts with the run (on_start), not before the target

    def __exit__(self, *exc: Any) -> None:
        if self.started:
            self.live.__exit__(*exc)
            self.started = False
            self.console.line()  # the display leaves its cursor at the end of its last line

    def _render(self) -> Group:
        table = trials_table(self.rows[-12:])
        best = (
            f"best so far: trial {self.best.number}  {escape(self.best.config.label())}  "
            f"{_rps(self.best, ' req/s')}  {latency_text(self.best)}"
            if self.best
            else "best so far: none meets the goals yet"
        )
        now = f"now: {self.current}  {self.phase}"
        return Group(self.progress, escape(now), table, best)

    def _refresh(self) -> None:
        self.live.update(self._render())

    def on_start(self, run_dir: Path, scenario: Scenario, target: dict[str, Any]) -> None:
        self.console.print(start_line(run_dir, scenario, target), highlight=False, markup=False)
        self.live.__enter__()
        self.started = True

    def on_server_left(self, left: dict[str, Any]) -> None:
        self.console.print(server_left_line(left), highlight=False, markup=False)

    def on_trial_start(
        self, number: int, source: str, knobs: TrialKnobs, index: int, budget: int
    ) -> None:
        # Number -1 is the baseline's config: measured ("baseline") or profiled ("profile").
        if number < 0:
            label = "profile phase" if source == "profile" else "baseline"
        else:
            label = f"trial {number} ({source})"
        self.current = f"{label}: {knobs.label()}"
        self.phase = ""
        self._refresh()

    def on_phase(self, text: str) -> None:
        self.phase = text
        if self.verbose:
            self._step(text)
        self._refresh()

    def _step(self, text: str) -> None:
        """A step of the measurement under way, as a line of its own (``--verbose``)."""
        self.console.print(f"  {self.current}: {text}", highlight=False, markup=False)

    def on_note(self, text: str) -> None:
        self.console.print(f"note: {text}", highlight=False, markup=False)

    def on_server(self, text: str) -> None:
        self.console.print(f"server: {text}", highlight=False, markup=False)

    def on_trial_end(self, result: TrialRecord, best: TrialRecord | None) -> None:
        self.rows.append(result)
        self.best = best or self.best
        if result.number >= 0:
            self.progress.advance(self.task)
        self._refresh()

    def on_validation(
        self, number: int, repeat: int, result: TrialRecord, check_rps: float | None = None
    ) -> None:
        self.phase = f"validated trial {number} repeat {repeat}: " + validation_text(
            result, check_rps
        )
        self._refresh()


class PlainView(LiveView):
    """The live view for a log (stdout not a terminal: CI, ``| tee``): no redrawn display, one
    plain line per trial started and finished, per validation repeat, each with the time since
    the run started, so a CI log shows the run as it goes."""

    def __init__(self, console: Console, budget: int, *, verbose: bool = False) -> None:
        super().__init__(console, budget, verbose=verbose)
        self.t0 = time.monotonic()

    def _line(self, text: str) -> None:
        self.console.print(
            f"[{time.monotonic() - self.t0:5.0f} s] {text}", highlight=False, markup=False
        )

    def on_start(self, run_dir: Path, scenario: Scenario, target: dict[str, Any]) -> None:
        self.t0 = time.monotonic()
        self.console.print(start_line(run_dir, scenario, target), highlight=False, markup=False)

    def _refresh(self) -> None:
        """Nothing is redrawn in a log."""

    def _step(self, text: str) -> None:
        self._line(f"  {self.current}: {text}")

    def on_trial_start(
        self, number: int, source: str, knobs: TrialKnobs, index: int, budget: int
    ) -> None:
        super().on_trial_start(number, source, knobs, index, budget)
        if source == "validation":
            return  # its result line says it
        self._line(f"{self.current}: measuring")

    def on_trial_end(self, result: TrialRecord, best: TrialRecord | None) -> None:
        super().on_trial_end(result, best)
        label = "baseline" if result.number < 0 else f"trial {result.number}"
        if result.state == "complete":
            verdict = "met the goals" if result.meets_goals else "missed the goals"
            text = f"{_rps(result, ' req/s')}, {latency_text(result)}{_batches(result)}: {verdict}"
        else:
            text = f"{result.state}: {result.failure or ''}"
        done = f"{int(self.progress.tasks[0].completed)}/{self.progress.tasks[0].total:.0f}"
        best_text = (
            f"best so far trial {self.best.number} {_rps(self.best, ' req/s')}"
            if self.best is not None
            else "nothing meets the goals yet"
        )
        suffix = f" ({done} trials; {best_text})" if result.number >= 0 else ""
        self._line(f"{label}: {text}{suffix}")

    def on_validation(
        self, number: int, repeat: int, result: TrialRecord, check_rps: float | None = None
    ) -> None:
        text = validation_text(result, check_rps)
        self._line(f"validation of trial {number}, repeat {repeat}: {text}")


def validation_text(result: TrialRecord, check_rps: float | None) -> str:
    """One validation repeat in words. A check at one rate says the rate it checked and whether
    it held there ("missed at 187 req/s: p99 82.0 ms"), never a capacity of 0: it searched for
    none. A capacity search says the capacity it found."""
    if result.state != "complete":
        return f"{result.state}: {result.failure or ''}"
    if check_rps is not None:
        verdict = "held" if result.meets_goals else "missed"
        return f"{verdict} at {check_rps:.1f} req/s: {latency_text(result)}"
    verdict = "met the goals" if result.meets_goals else "missed the goals"
    return f"{_rps(result, ' req/s')}, {latency_text(result)}: {verdict}"


def server_left_line(left: dict[str, Any]) -> str:
    """``server left with: ...``: what a shared server holds after the run (or why nothing)."""
    knobs = left.get("knobs")
    label = f" [{knobs_from_dict(knobs).label()}]" if knobs else ""
    return f"server left with: {left.get('detail')}{label}"


#: The phases in the order a run goes through them (summary.json ``phases``, and the report).
PHASES = ("baseline", "profile", "predict", "search", "validation", "report")


def phases_line(summary: SweepOutcome) -> str:
    """``time per phase: baseline 12 s, profile 8 s, ...`` (phases that did not run left out),
    with the search strategy that ran."""
    phases = summary.phases or dict(summary.data.get("phases") or {})
    parts = [f"{name} {phases[name]:.0f} s" for name in PHASES if name in phases]
    strategy = summary.data.get("search_strategy") or "?"
    return f"search {strategy}; time per phase: " + (", ".join(parts) or "not recorded")


def stages_text(stages: Sequence[StageBreakdown], limit: str | None = None) -> str:
    """``pre 0.4+1.0 ms x1.0 busy 12% | infer ... ; limits capacity: infer`` (queue + compute
    per request, mean batch, instances' busy share; ``limit``: the stage or model that limits,
    else the busiest)."""
    parts = [
        f"{s.name} {s.queue_us / 1000:.1f}+{s.compute_us / 1000:.1f} ms "
        f"batch {s.avg_batch_size:.1f} busy "
        + ("-" if s.busy_pct is None else f"{s.busy_pct:.0f}%")
        for s in stages
    ]
    limit = limit or limiting_stage(stages)
    return " | ".join(parts) + (f"; limits capacity: {limit}" if limit else "")


def summary_table(summary: SweepOutcome, goals: Goals | None = None) -> Table:
    """Baseline vs best, gain, and where the files are; with ``goals`` and a priority mix, a
    line per config with each traffic class's p99 against its own goal."""
    validated = any(
        r is not None and r.source == "validation" for r in (summary.baseline, summary.best)
    )
    caption = "req/s: highest load meeting the goals"
    if validated:
        caption += " (worst validation repeat: longer windows, re-measured after the search)"
    table = Table(title=f"perfsweep run {summary.run_id}", caption=caption)
    engine = any(
        isinstance(r.config, EngineKnobs) for r in (summary.baseline, summary.best) if r is not None
    )
    names = (
        ("max_num_seqs", "max_tokens", "prefill", "engines", "req/s", "TTFT p99", "ITL p99")
        if engine
        else ("max_batch_size", "delay us", "preferred", "instances", "req/s", "p50 ms", "p99 ms")
    )
    for name in ("", *names, "goals"):
        table.add_column(name, justify="left" if name in ("", "preferred", "goals") else "right")
    footnotes = []
    for label, r in (("baseline", summary.baseline), ("best", summary.best)):
        entry = summary.data.get(label) or {}
        p99 = f"{r.p99_ms:.1f}" if r is not None else "-"
        if entry.get("p99_n") is not None:  # every percentile with its sample count
            p99 += f" (n={entry['p99_n']})"
        if entry.get("p99_note"):
            p99 += "*"
            footnotes.append(f"* {label}: {entry['p99_note']}")
        if r is None:
            table.add_row(label, "-", "-", "-", "-", "-", "-", "-", "none met the goals")
            continue
        point = r.operating_point()
        if goals is not None and point is not None and point.classes:
            footnotes.append(f"{label} by class: {classes_text(point, goals)}")
        if point is not None and point.server is not None:
            stages = stage_breakdown(r, point.server, point.duration_s)
            if stages:
                # A mix of models reads each model's statistics as a pipeline reads its stages'.
                part = "model" if any(c.model for c in point.classes) else "stage"
                limit = limiting_stage(stages, point, goals)
                footnotes.append(f"{label} by {part}: {stages_text(stages, limit)}")
        f = r.token_figures()
        table.add_row(
            label,
            *knob_cells(r.config),
            _rps(r),
            f"{f['ttft_p99_ms']:.1f}" if f else f"{r.p50_ms:.1f}",
            f"{f['itl_p99_ms']:.1f}" if f else p99,
            "met" if r.meets_goals else "missed",
        )
    if footnotes:
        table.caption = "\n".join([caption, *dict.fromkeys(footnotes)])
    return table
