"""``perfsweep run``: find the best dynamic-batching config, write it as config.pbtxt.

The command builds the scenario (bundled or ``--scenario`` file, ``PERFSWEEP_*`` variables,
flags), calls :func:`analyzer.sweep.loop.run_sweep` with a live view, and prints a summary table.
Ctrl-C stops after the current step; finished trials are kept and the command prints how to
resume. Exit codes: 0 done (a config meets the goals), 1 nothing met the goals, 2 bad input,
3 the target failed (it could not start, or died and was not brought back: the run so far is
written, and the error names the ``--resume`` command), 130 interrupted.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from analyzer.commands.input_flags import (
    ArrivalFlag,
    BatchSizeFlag,
    ExpectWorkersFlag,
    GrpcUrlFlag,
    HeaderFileFlag,
    HeaderFlag,
    InputDataFlag,
    MasterBindHostFlag,
    MasterPortFlag,
    MetricsUrlFlag,
    ProtocolFlag,
    RepeatRatioFlag,
    ShapeFlag,
    SharedMemoryFlag,
    SslCaFlag,
    SslCertFlag,
    SslInsecureFlag,
    SslKeyFlag,
    TraceFlag,
    TraceUnitFlag,
    UniquePayloadsFlag,
    WorkersFlag,
    access_overrides,
    generator_overrides,
    input_overrides,
    traffic_overrides,
)
from analyzer.config.access import redact_command
from analyzer.config.knobs import Knobs
from analyzer.config.scenario import Scenario, bundled_scenario, load_scenario
from analyzer.config.traffic import TrafficMode
from analyzer.errors import GoalNotMetError, InputError, TargetDiedError
from analyzer.evaluation.plan import LoadPlan
from analyzer.measure.goals import classes_text
from analyzer.measure.specs import Goals
from analyzer.rundir.summary import StopReason
from analyzer.rundir.trial_record import TrialRecord
from analyzer.sweep.state import SweepObserver, SweepOutcome
from analyzer.target.server_stats import cache_hit_ratio, cache_hits_text


def start_line(run_dir: Path, scenario: Scenario, target: dict[str, Any]) -> str:
    """The run's first line: model, target, goal, the traffic's shape when not Poisson."""
    line = (
        f"perfsweep run: model {scenario.model.name} on {target.get('device')} at "
        f"{target.get('url')}; goal p99 <= {scenario.goals.p99_ms:g} ms"
    )
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


def _rps(r: TrialRecord, unit: str = "") -> str:
    """A throughput as the console prints it, with the response cache's hit ratio beside it when
    the measurement was served partly from the cache (so no one mistakes a cache for a faster
    model)."""
    point = r.operating_point()
    hits = cache_hits_text(cache_hit_ratio(point.server if point is not None else None))
    return f"{r.throughput_rps:.1f}{unit}" + (f" ({hits})" if hits else "")


class LiveView(SweepObserver):
    """Progress with ETA, the current trial, a table of finished trials and the best so far."""

    def __init__(self, console: Console, budget: int) -> None:
        self.console = console
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
        table = Table(title="finished trials", expand=False, show_lines=False)
        for name in ("#", "source", "config", "rps", "p99 ms", "goals"):
            table.add_column(name, justify="right" if name in ("#", "rps", "p99 ms") else "left")
        for r in self.rows[-12:]:
            table.add_row(
                "base" if r.number < 0 else str(r.number),
                r.source,
                r.config.label(),
                _rps(r) if r.state == "complete" else "-",
                f"{r.p99_ms:.1f}" if r.state == "complete" else "-",
                ("[green]met" if r.meets_goals else "[red]missed")
                if r.state == "complete"
                else f"[red]{r.state}: {escape((r.failure or '')[:60])}",
            )
        best = (
            f"best so far: trial {self.best.number}  {escape(self.best.config.label())}  "
            f"{_rps(self.best, ' req/s')}  p99 {self.best.p99_ms:.1f} ms"
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
        self, number: int, source: str, knobs: Knobs, index: int, budget: int
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
        self._refresh()

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

    def on_validation(self, number: int, repeat: int, result: TrialRecord) -> None:
        self.phase = f"validated trial {number} repeat {repeat}: {result.throughput_rps:.1f} req/s"
        self._refresh()


class PlainView(LiveView):
    """The live view for a log (stdout not a terminal: CI, ``| tee``): no redrawn display, one
    plain line per trial started and finished, per validation repeat, each with the time since
    the run started, so a CI log shows the run as it goes."""

    def __init__(self, console: Console, budget: int) -> None:
        super().__init__(console, budget)
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

    def on_trial_start(
        self, number: int, source: str, knobs: Knobs, index: int, budget: int
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
            text = f"{_rps(result, ' req/s')}, p99 {result.p99_ms:.1f} ms: {verdict}"
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

    def on_validation(self, number: int, repeat: int, result: TrialRecord) -> None:
        if result.state == "complete":
            verdict = "met the goals" if result.meets_goals else "missed the goals"
            text = f"{_rps(result, ' req/s')}, p99 {result.p99_ms:.1f} ms: {verdict}"
        else:
            text = f"{result.state}: {result.failure or ''}"
        self._line(f"validation of trial {number}, repeat {repeat}: {text}")


def server_left_line(left: dict[str, Any]) -> str:
    """``server left with: ...``: what a shared server holds after the run (or why nothing)."""
    knobs = left.get("knobs")
    label = f" [{Knobs.from_dict(knobs).label()}]" if knobs else ""
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
    for name in (
        "",
        "max_batch_size",
        "delay us",
        "preferred",
        "instances",
        "req/s",
        "p50 ms",
        "p99 ms",
        "goals",
    ):
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
        k = r.config
        table.add_row(
            label,
            str(k.max_batch_size),
            str(k.max_queue_delay_us) if k.dynamic_batching else "off",
            " ".join(str(s) for s in k.preferred_batch_size) or "-",
            str(k.instance_count),
            _rps(r),
            f"{r.p50_ms:.1f}",
            p99,
            "met" if r.meets_goals else "missed",
        )
    if footnotes:
        table.caption = "\n".join([caption, *dict.fromkeys(footnotes)])
    return table


def register(app: typer.Typer) -> None:
    """Add ``perfsweep run`` to the app."""

    @app.command("run")
    def run(
        model: Annotated[
            str | None,
            typer.Option(help="Bundled model name, or a model in --model-repository / at --url."),
        ] = None,
        scenario_file: Annotated[
            Path | None,
            typer.Option(
                "--scenario", help="Scenario TOML file (default: scenarios/<model>.toml)."
            ),
        ] = None,
        model_repository: Annotated[
            Path | None, typer.Option(help="Model repository for the managed reference server.")
        ] = None,
        url: Annotated[
            str | None,
            typer.Option(
                help="HTTP URL of a running server (Triton or reference); nothing is started."
            ),
        ] = None,
        server: Annotated[
            str | None,
            typer.Option(
                help="Managed server to start: reference (default, the bundled one) | triton "
                "(a tritonserver binary on the --model-repository). Ignored with --url."
            ),
        ] = None,
        protocol: ProtocolFlag = None,
        triton_server_path: Annotated[
            Path | None,
            typer.Option(help="--server triton: the tritonserver binary (default: on PATH)."),
        ] = None,
        metrics_url: MetricsUrlFlag = None,
        max_gpu_memory_mb: Annotated[
            float | None,
            typer.Option(
                help="GPU memory goal, MiB: configs using more at their operating point miss the goals."
            ),
        ] = None,
        min_gpu_utilization: Annotated[
            float | None,
            typer.Option(
                "--min-gpu-utilization",
                help="Report flag: mark configs whose GPU utilisation at their operating point "
                "is below this percentage (perfsweep report has it too).",
            ),
        ] = None,
        device: Annotated[
            str | None, typer.Option(help="auto | cpu | cuda | sim (managed server).")
        ] = None,
        objective: Annotated[
            str | None, typer.Option(help="throughput | latency | pareto.")
        ] = None,
        p99_ms: Annotated[float | None, typer.Option(help="P99 latency goal, ms.")] = None,
        min_throughput_rps: Annotated[
            float | None, typer.Option(help="Minimum throughput goal, req/s.")
        ] = None,
        rate_rps: Annotated[
            float | None, typer.Option(help="Offered load for --objective latency, req/s.")
        ] = None,
        shape: ShapeFlag = None,
        input_data: InputDataFlag = None,
        batch_size: BatchSizeFlag = None,
        unique_payloads: UniquePayloadsFlag = None,
        repeat_ratio: RepeatRatioFlag = None,
        shared_memory: SharedMemoryFlag = None,
        trials: Annotated[
            int | None, typer.Option(help="Search trials (baseline and validation come on top).")
        ] = None,
        time_budget: Annotated[
            float | None, typer.Option(help="Stop starting trials after this many seconds.")
        ] = None,
        patience: Annotated[
            int | None, typer.Option(help="Stop after this many trials without improvement.")
        ] = None,
        window_s: Annotated[float | None, typer.Option(help="Measurement window, seconds.")] = None,
        seed: Annotated[int | None, typer.Option(help="Sampler and load seed.")] = None,
        search: Annotated[
            str | None,
            typer.Option(
                "--search",
                help="predict (default: profile the server, simulate every config, measure the "
                "predicted best first; tpe where no profile can be taken) | tpe | random | grid.",
            ),
        ] = None,
        output_dir: Annotated[
            Path | None, typer.Option(help="Root of run directories (default reports/).")
        ] = None,
        storage: Annotated[
            str | None, typer.Option(help="Shared Optuna storage URL (postgresql://...).")
        ] = None,
        study_name: Annotated[
            str | None, typer.Option(help="Study name in --storage (shared by workers).")
        ] = None,
        resume: Annotated[
            Path | None, typer.Option(help="Continue the run in this directory.")
        ] = None,
        run_dir: Annotated[
            Path | None,
            typer.Option(help="Exact run directory to create (default: <output-dir>/<run-id>)."),
        ] = None,
        leave: Annotated[
            str | None,
            typer.Option(
                help="What a --url server holds at the end (also on Ctrl-C or failure): "
                "original (default) or best."
            ),
        ] = None,
        server_wait: Annotated[
            float | None,
            typer.Option(
                help="Seconds to wait for a --url server that stopped answering to return "
                "(default 60); not back in time, the run stops with exit status 3."
            ),
        ] = None,
        workers: WorkersFlag = None,
        expect_workers: ExpectWorkersFlag = None,
        master_bind_host: MasterBindHostFlag = None,
        master_port: MasterPortFlag = None,
        arrival: ArrivalFlag = None,
        trace: TraceFlag = None,
        trace_unit: TraceUnitFlag = None,
        grpc_url: GrpcUrlFlag = None,
        ssl_ca: SslCaFlag = None,
        ssl_cert: SslCertFlag = None,
        ssl_key: SslKeyFlag = None,
        ssl_insecure: SslInsecureFlag = False,
        header: HeaderFlag = None,
        header_file: HeaderFileFlag = None,
    ) -> None:
        """Find the dynamic-batching config that serves the most traffic within the P99 goal."""
        if min_gpu_utilization is not None:
            from analyzer.report.gpu import check_threshold

            check_threshold(min_gpu_utilization)
        overrides: dict[str, Any] = {
            "model.name": model,
            "model.repository": str(model_repository) if model_repository else None,
            "model.url": url,
            "model.server": server,
            "model.triton_server_path": str(triton_server_path) if triton_server_path else None,
            "goals.max_gpu_memory_mb": max_gpu_memory_mb,
            "model.device": device,
            "objective": objective,
            "goals.p99_ms": p99_ms,
            # The scenario's reason for its goal does not hold for a goal set here.
            "goals.note": "set with --p99-ms" if p99_ms is not None else None,
            "goals.min_throughput_rps": min_throughput_rps,
            "traffic.rate_rps": rate_rps,
            **input_overrides(
                shape, input_data, batch_size, unique_payloads, repeat_ratio, shared_memory
            ),
            **traffic_overrides(arrival, trace, trace_unit),
            "budget.trials": trials,
            "budget.time_budget_s": time_budget,
            "budget.patience": patience,
            "budget.window_s": window_s,
            "run.seed": seed,
            "search.strategy": search,
            "run.output_dir": str(output_dir) if output_dir else None,
            "run.storage": storage,
            "run.study_name": study_name,
            "run.leave": leave,
            "run.server_wait_s": server_wait,
            **generator_overrides(
                protocol, metrics_url, workers, expect_workers, master_bind_host, master_port
            ),
            **access_overrides(
                grpc_url, ssl_ca, ssl_cert, ssl_key, ssl_insecure, header, header_file
            ),
        }
        if resume is not None:
            saved = resume / "scenario.toml"
            if not saved.is_file():
                raise InputError(f"{resume} is not a perfsweep run directory (no scenario.toml)")
            # Only budgets, what is left on the server and where the generator runs may change
            # on resume: the study's space and goals must stay the same.
            # Headers are never saved: they are given again (a token may have been renewed).
            generator = {
                "model.headers",
                "run.leave",
                "run.server_wait_s",
                "traffic.workers",
                "traffic.expect_workers",
                "traffic.master_bind_host",
                "traffic.master_port",
            }
            allowed = {
                k: v for k, v in overrides.items() if k.startswith("budget.") or k in generator
            }
            scenario = load_scenario(saved, allowed)
        else:
            path = scenario_file
            if path is None and url is None and model_repository is None:
                path = bundled_scenario(model or "resnet50", device)
            scenario = load_scenario(path, overrides)
        _run(scenario, resume, run_dir, min_gpu_utilization)


def _run(
    scenario: Scenario,
    resume: Path | None,
    run_dir: Path | None,
    min_gpu_utilization: float | None = None,
) -> None:
    # The engine monkey-patches the process for gevent on import; that must happen before any
    # thread exists (the live view starts one), or the patch deadlocks on the import lock.
    import analyzer.load.runner  # noqa: F401
    from analyzer.sweep.loop import run_sweep

    # Piped output (CI logs, `| tee`) gets a fixed width instead of rich's 80-column default.
    console = Console(width=None if sys.stdout.isatty() else 120)
    t0 = time.monotonic()
    died: TargetDiedError | None = None
    view_type = LiveView if console.is_terminal else PlainView
    with view_type(console, scenario.budget.trials) as view:
        try:
            summary = run_sweep(
                scenario,
                run_dir=resume or run_dir,
                resume=resume is not None,
                observer=view,
                command=redact_command(["perfsweep", *sys.argv[1:]]),
            )
        except TargetDiedError as exc:
            if not isinstance(exc.outcome, SweepOutcome):
                raise  # it died before the run started: the error says it all
            died, summary = exc, exc.outcome
    if min_gpu_utilization is not None:
        # A report flag, not a goal: the sweep's report is rendered again with the flags.
        from analyzer.report import write_report

        write_report(summary.run_dir, min_gpu_utilization_pct=min_gpu_utilization)
    console.print(summary_table(summary, LoadPlan(scenario).goals))
    if (note := ceiling_note(summary, scenario)) is not None:
        console.print(f"[bold yellow]{note}[/]", highlight=False)
    # The same sentences as summary.json and the report's verdict (gain with its interval).
    console.print(summary.data.get("goal_text", ""), highlight=False)
    console.print(
        f"[bold]{summary.data.get('gain_text', 'gain over baseline: n/a')}[/]\n"
        f"trials: {summary.trials}   stopped by: {summary.stop_reason}   "
        f"({time.monotonic() - t0:.0f} s)",
        highlight=False,
    )
    if summary.data.get("search_note"):
        console.print(f"search: {summary.data['search_note']}", highlight=False, markup=False)
    console.print(phases_line(summary), highlight=False)
    root = summary.run_dir
    recommendation = summary.data.get("recommendation") or {}
    if recommendation.get("candidate_config"):
        # The one recommendation rule (sweep._recommend): only a significant gain is applied.
        console.print(
            f"[bold yellow]recommended: {escape(recommendation['detail'])}[/]", highlight=False
        )
    if summary.best_config_path:
        console.print(f"best config:  {summary.best_config_path}", highlight=False)
    if recommendation.get("candidate_config"):
        console.print(f"candidate:    {root / recommendation['candidate_config']}", highlight=False)
    console.print(
        f"summary:      {root / 'summary.json'}\nreport:       {root / 'report.html'}",
        highlight=False,
    )
    if died is not None:
        raise TargetDiedError(
            f"{died} -- the run stopped: nothing was measured against the dead server, the best "
            f"so far is not validated and no best config was written. Once the server answers, "
            f"resume with: perfsweep run --resume {root}",
            died.url,
        )
    if summary.stop_reason is StopReason.INTERRUPTED:
        console.print(
            f"interrupted: finished trials are kept. Resume with: perfsweep run --resume {root}",
            highlight=False,
        )
        raise typer.Exit(130)
    if summary.best is None:
        raise GoalNotMetError(
            f"no config met p99 <= {scenario.goals.p99_ms:g} ms; relax --p99-ms or widen the space ({root})"
        )
