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
from rich.console import Console
from rich.markup import escape

from analyzer.commands.help import (
    GOALS,
    OUTPUT,
    SEARCH,
    SERVER,
    TRAFFIC,
    Device,
    Engine,
    Leave,
    ObjectiveName,
    RaggedBatch,
    SearchStrategy,
    ServerKind,
    epilog,
    from_scenario,
    value,
)
from analyzer.commands.input_flags import (
    ArrivalFlag,
    BatchSizeFlag,
    DatasetFlag,
    ExpectWorkersFlag,
    GrpcUrlFlag,
    HeaderFileFlag,
    HeaderFlag,
    InputDataFlag,
    InputTokensFlag,
    ItlP99Flag,
    MasterBindHostFlag,
    MasterPortFlag,
    MetricsUrlFlag,
    MixFlag,
    OutputTokensFlag,
    PadBucketsFlag,
    PadValuesFlag,
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
    TtftP99Flag,
    UniquePayloadsFlag,
    WorkersFlag,
    access_overrides,
    generator_overrides,
    input_overrides,
    mix_overrides,
    traffic_overrides,
)
from analyzer.commands.names import command_class
from analyzer.commands.run_view import (
    LiveView,
    PlainView,
    QuietView,
    Verbosity,
    ceiling_note,
    phases_line,
    summary_table,
    trials_table,
    trials_text,
)
from analyzer.config.access import redact_command
from analyzer.config.scenario import Scenario, bundled_scenario, load_scenario
from analyzer.errors import GoalNotMetError, InputError, TargetDiedError
from analyzer.evaluation.plan import LoadPlan
from analyzer.rundir.summary import StopReason
from analyzer.sweep.state import SweepOutcome

EXAMPLES = epilog(
    [
        (
            "perfsweep run --model resnet50 --device sim",
            "the bundled ResNet-50 on the simulated GPU: a sweep of a few minutes",
        ),
        (
            "perfsweep run --model resnet50 --device sim --server virtual",
            "the same sweep in virtual time: seconds, the simulator's figures",
        ),
        (
            "perfsweep run --scenario scenarios/mix.toml",
            "two models of examples/mix served together, each held to its own p99",
        ),
        (
            "perfsweep run --url http://127.0.0.1:8000 --model m --p99-ms 50 --leave best",
            "a running Triton: its model m, left on the best config",
        ),
        (
            "perfsweep run --model-repository models/ --model m --p99-ms 50 --time-budget-s 600 -q",
            "your repository on the managed server, ten minutes at most, only the answer printed",
        ),
        ("perfsweep run --resume reports/20260101-120000-m", "continue a stopped run"),
    ],
    "Exit status: 0 a config meets the goals, 1 none does, 2 bad input, 3 the server failed "
    "(the run so far is kept; the error names the --resume command), 130 interrupted.",
)


def register(app: typer.Typer) -> None:
    """Add ``perfsweep run`` to the app."""

    @app.command("run", cls=command_class("run"), epilog=EXAMPLES)
    def run(
        model: Annotated[
            str | None,
            typer.Option(
                help="Bundled model name, or a model in --model-repository / at --url.",
                show_default="resnet50, or the scenario's model.name",
                rich_help_panel=SERVER,
            ),
        ] = None,
        scenario_file: Annotated[
            Path | None,
            typer.Option(
                "--scenario",
                help="Scenario TOML file: every setting below, and more (flags override it).",
                show_default="scenarios/<model>.toml",
                rich_help_panel=SERVER,
            ),
        ] = None,
        model_repository: Annotated[
            Path | None,
            typer.Option(
                help="Model repository for the managed server.",
                show_default="the bundled model's",
                rich_help_panel=SERVER,
            ),
        ] = None,
        composing_models: Annotated[
            str | None,
            typer.Option(
                help="A pipeline's models to tune together, comma-separated (load goes to "
                "--model): required for a BLS model; an ensemble's are found in its steps.",
                rich_help_panel=SERVER,
            ),
        ] = None,
        url: Annotated[
            str | None,
            typer.Option(
                metavar="<URL|HOST:PORT>",
                help="The HTTP address of a running server (Triton or reference): tune it "
                "there, nothing is started.",
                rich_help_panel=SERVER,
            ),
        ] = None,
        grpc_url: GrpcUrlFlag = None,
        protocol: ProtocolFlag = None,
        metrics_url: MetricsUrlFlag = None,
        server: Annotated[
            ServerKind | None,
            typer.Option(
                help="Managed server to start: reference (the bundled one) | triton "
                "(a tritonserver binary on the --model-repository) | virtual (none: the "
                "simulated device simulated in virtual time, a 20-trial sweep in seconds, to try "
                "a space or budget; figures are the simulator's). Ignored with --url.",
                show_default=from_scenario("model.server"),
                rich_help_panel=SERVER,
            ),
        ] = None,
        triton_server_path: Annotated[
            Path | None,
            typer.Option(
                help="--server triton: the tritonserver binary.",
                show_default="on PATH",
                rich_help_panel=SERVER,
            ),
        ] = None,
        device: Annotated[
            Device | None,
            typer.Option(
                help="The managed server's device (sim: a simulated GPU).",
                show_default=from_scenario("model.device"),
                rich_help_panel=SERVER,
            ),
        ] = None,
        leave: Annotated[
            Leave | None,
            typer.Option(
                help="What a --url server holds at the end (also on Ctrl-C or failure).",
                show_default=from_scenario("run.leave"),
                rich_help_panel=SERVER,
            ),
        ] = None,
        server_wait_s: Annotated[
            float | None,
            typer.Option(
                help="Seconds to wait for a --url server that stopped answering to return; "
                "not back in time, the run stops with exit status 3.",
                show_default=from_scenario("run.server_wait_s"),
                rich_help_panel=SERVER,
            ),
        ] = None,
        objective: Annotated[
            ObjectiveName | None,
            typer.Option(
                help="throughput: the highest load within the goals; latency: the lowest p99 "
                "at --rate-rps; pareto: the throughput-p99 front.",
                show_default=from_scenario("objective"),
                rich_help_panel=GOALS,
            ),
        ] = None,
        p99_ms: Annotated[
            float | None,
            typer.Option(
                help="P99 latency goal, ms.",
                show_default=from_scenario("goals.p99_ms"),
                rich_help_panel=GOALS,
            ),
        ] = None,
        min_throughput_rps: Annotated[
            float | None,
            typer.Option(
                help="Throughput goal, req/s.",
                show_default=from_scenario("goals.min_throughput_rps"),
                rich_help_panel=GOALS,
            ),
        ] = None,
        max_gpu_memory_mb: Annotated[
            float | None,
            typer.Option(
                help="GPU memory goal, MiB: configs using more at their operating point miss "
                "the goals.",
                show_default=from_scenario("goals.max_gpu_memory_mb"),
                rich_help_panel=GOALS,
            ),
        ] = None,
        rate_rps: Annotated[
            float | None,
            typer.Option(
                help="Offered load for --objective latency, req/s.",
                show_default=from_scenario("traffic.rate_rps"),
                rich_help_panel=TRAFFIC,
            ),
        ] = None,
        arrival: ArrivalFlag = None,
        trace: TraceFlag = None,
        trace_unit: TraceUnitFlag = None,
        mix: MixFlag = None,
        shape: ShapeFlag = None,
        input_data: InputDataFlag = None,
        batch_size: BatchSizeFlag = None,
        unique_payloads: UniquePayloadsFlag = None,
        repeat_ratio: RepeatRatioFlag = None,
        shared_memory: SharedMemoryFlag = None,
        pad_buckets: PadBucketsFlag = None,
        pad_values: PadValuesFlag = None,
        input_tokens: InputTokensFlag = None,
        output_tokens: OutputTokensFlag = None,
        dataset: DatasetFlag = None,
        ttft_p99_ms: TtftP99Flag = None,
        itl_p99_ms: ItlP99Flag = None,
        serve_command: Annotated[
            str | None,
            typer.Option(
                metavar="<COMMAND>",
                help="A generative server that takes its settings on the command line (vllm "
                "serve, SGLang): its command with the knobs as placeholders "
                "({max_num_seqs}, {max_num_batched_tokens}, {enable_chunked_prefill}, "
                "{gpu_memory_utilization}, or the engine's own names) and {port}; started per "
                "config on loopback, awaited, stopped at the end. Use with --protocol openai.",
                rich_help_panel=SERVER,
            ),
        ] = None,
        engine: Annotated[
            Engine | None,
            typer.Option(
                help="The engine behind --serve-command (its placeholders' names).",
                show_default="vllm",
                rich_help_panel=SERVER,
            ),
        ] = None,
        max_num_seqs: Annotated[
            str | None,
            typer.Option(
                metavar="<N,N,...>",
                help="A generative engine's running-set sizes to search (vLLM's "
                "max_num_seqs; TensorRT-LLM's max_batch_size; SGLang's "
                "--max-running-requests).",
                show_default="1,2,4,...,64",
                rich_help_panel=SEARCH,
            ),
        ] = None,
        max_num_batched_tokens: Annotated[
            str | None,
            typer.Option(
                metavar="<N,N,...>",
                help="A generative engine's step token budgets to search (vLLM's "
                "max_num_batched_tokens; TensorRT-LLM's max_num_tokens; SGLang's "
                "--max-prefill-tokens).",
                show_default="512,2048,8192",
                rich_help_panel=SEARCH,
            ),
        ] = None,
        search: Annotated[
            SearchStrategy | None,
            typer.Option(
                "--search",
                help="predict: profile the server, simulate every config, measure the "
                "predicted best first (tpe where no profile can be taken); tpe, random: "
                "Optuna's samplers; grid: every config in order.",
                show_default=from_scenario("search.strategy"),
                rich_help_panel=SEARCH,
            ),
        ] = None,
        ragged_batch: Annotated[
            RaggedBatch | None,
            typer.Option(
                "--ragged-batch",
                help="allow_ragged_batch on the inputs with a variable dimension: on, off, or "
                "search (try both). Opt-in: the backend must accept ragged batches (the Python "
                "backend does; others need a batch_input).",
                show_default=from_scenario("space.ragged_batch"),
                rich_help_panel=SEARCH,
            ),
        ] = None,
        trials: Annotated[
            int | None,
            typer.Option(
                help="Search trials (baseline and validation come on top).",
                show_default=from_scenario("budget.trials"),
                rich_help_panel=SEARCH,
            ),
        ] = None,
        time_budget_s: Annotated[
            float | None,
            typer.Option(
                help="Stop starting trials after this many seconds.",
                show_default=from_scenario("budget.time_budget_s"),
                rich_help_panel=SEARCH,
            ),
        ] = None,
        patience: Annotated[
            int | None,
            typer.Option(
                help="Stop after this many trials without improvement.",
                show_default=from_scenario("budget.patience"),
                rich_help_panel=SEARCH,
            ),
        ] = None,
        window_s: Annotated[
            float | None,
            typer.Option(
                help="Measurement window, seconds.",
                show_default=from_scenario("budget.window_s"),
                rich_help_panel=SEARCH,
            ),
        ] = None,
        seed: Annotated[
            int | None,
            typer.Option(
                help="Sampler and load seed.",
                show_default=from_scenario("run.seed"),
                rich_help_panel=SEARCH,
            ),
        ] = None,
        storage: Annotated[
            str | None,
            typer.Option(
                help="Shared Optuna storage URL (postgresql://...): workers on several "
                "machines share one study.",
                rich_help_panel=SEARCH,
            ),
        ] = None,
        study_name: Annotated[
            str | None,
            typer.Option(
                help="Study name in --storage (shared by workers).", rich_help_panel=SEARCH
            ),
        ] = None,
        output_dir: Annotated[
            Path | None,
            typer.Option(
                help="Root of the run directories.",
                show_default=from_scenario("run.output_dir"),
                rich_help_panel=OUTPUT,
            ),
        ] = None,
        run_dir: Annotated[
            Path | None,
            typer.Option(
                help="Exact run directory to create.",
                show_default="<output-dir>/<run-id>",
                rich_help_panel=OUTPUT,
            ),
        ] = None,
        resume: Annotated[
            Path | None,
            typer.Option(help="Continue the run in this directory.", rich_help_panel=OUTPUT),
        ] = None,
        report: Annotated[
            bool | None,
            typer.Option(
                "--report/--no-report",
                help="Render report.html at the end; --no-report: summary.json only "
                "(perfsweep report RUN_DIR renders it later).",
                show_default="--report, or the scenario's run.report",
                rich_help_panel=OUTPUT,
            ),
        ] = None,
        min_gpu_utilization: Annotated[
            float | None,
            typer.Option(
                "--min-gpu-utilization",
                help="Report flag: mark configs whose GPU utilisation at their operating point "
                "is below this percentage (perfsweep report has it too).",
                rich_help_panel=OUTPUT,
            ),
        ] = None,
        quiet: Annotated[
            bool,
            typer.Option(
                "--quiet",
                "-q",
                help="Print only the answer (the best config and its gain) and errors.",
                rich_help_panel=OUTPUT,
            ),
        ] = False,
        verbose: Annotated[
            bool,
            typer.Option(
                "--verbose",
                "-v",
                help="Print more: each step of each measurement as it starts, and every "
                "trial at the end.",
                rich_help_panel=OUTPUT,
            ),
        ] = False,
        workers: WorkersFlag = None,
        expect_workers: ExpectWorkersFlag = None,
        master_bind_host: MasterBindHostFlag = None,
        master_port: MasterPortFlag = None,
        ssl_ca: SslCaFlag = None,
        ssl_cert: SslCertFlag = None,
        ssl_key: SslKeyFlag = None,
        ssl_insecure: SslInsecureFlag = False,
        header: HeaderFlag = None,
        header_file: HeaderFileFlag = None,
    ) -> None:
        """Find the dynamic-batching config that serves the most traffic within the p99 goal."""
        if quiet and verbose:
            raise InputError("give --quiet or --verbose, not both")
        if min_gpu_utilization is not None:
            from analyzer.report.gpu import check_threshold

            check_threshold(min_gpu_utilization)
        mixed = mix_overrides(mix)
        if model is None and mixed:
            model = mixed["traffic.classes"][0]["model"]
        overrides: dict[str, Any] = {
            "model.name": model,
            "model.repository": str(model_repository) if model_repository else None,
            "model.composing_models": (
                [m.strip() for m in composing_models.split(",") if m.strip()]
                if composing_models is not None
                else None
            ),
            "model.url": url,
            "model.server": value(server),
            "model.triton_server_path": str(triton_server_path) if triton_server_path else None,
            "goals.max_gpu_memory_mb": max_gpu_memory_mb,
            "model.device": value(device),
            "objective": value(objective),
            "goals.p99_ms": p99_ms,
            "goals.ttft_p99_ms": ttft_p99_ms,
            "goals.itl_p99_ms": itl_p99_ms,
            "traffic.input_tokens": input_tokens,
            "traffic.output_tokens": output_tokens,
            "traffic.dataset": str(dataset) if dataset else None,
            "model.serve_command": serve_command,
            "model.engine": value(engine),
            "space.max_num_seqs": _int_list(max_num_seqs, "--max-num-seqs"),
            "space.max_num_batched_tokens": _int_list(
                max_num_batched_tokens, "--max-num-batched-tokens"
            ),
            # The scenario's reason for its goal does not hold for a goal set here.
            "goals.note": "set with --p99-ms" if p99_ms is not None else None,
            "goals.min_throughput_rps": min_throughput_rps,
            "traffic.rate_rps": rate_rps,
            **input_overrides(
                shape,
                input_data,
                batch_size,
                unique_payloads,
                repeat_ratio,
                value(shared_memory),
                pad_buckets,
                pad_values,
            ),
            **traffic_overrides(arrival, trace, value(trace_unit)),
            **mixed,
            "budget.trials": trials,
            "budget.time_budget_s": time_budget_s,
            "budget.patience": patience,
            "budget.window_s": window_s,
            "run.seed": seed,
            "search.strategy": value(search),
            "space.ragged_batch": value(ragged_batch),
            "run.output_dir": str(output_dir) if output_dir else None,
            "run.storage": storage,
            "run.study_name": study_name,
            "run.leave": value(leave),
            "run.server_wait_s": server_wait_s,
            "run.report": report,
            **generator_overrides(
                value(protocol), metrics_url, workers, expect_workers, master_bind_host, master_port
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
                "run.report",
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
        _run(scenario, resume, run_dir, min_gpu_utilization, _verbosity(quiet, verbose))


def _int_list(text: str | None, flag: str) -> list[int] | None:
    """``1,2,4`` as integers (None: not given)."""
    if text is None:
        return None
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"{flag} takes integers separated by commas, got {text!r}") from None


def _verbosity(quiet: bool, verbose: bool) -> Verbosity:
    return Verbosity.QUIET if quiet else Verbosity.VERBOSE if verbose else Verbosity.NORMAL


def _run(
    scenario: Scenario,
    resume: Path | None,
    run_dir: Path | None,
    min_gpu_utilization: float | None = None,
    verbosity: Verbosity = Verbosity.NORMAL,
) -> None:
    if scenario.model.server != "virtual" or scenario.model.url:
        # The engine monkey-patches the process for gevent on import; that must happen before
        # any thread exists (the live view starts one), or the patch deadlocks on the import
        # lock. A sweep in virtual time sends no request: it never imports the engine.
        import analyzer.load.runner  # noqa: F401
    from analyzer.sweep.loop import run_sweep

    # Piped output (CI logs, `| tee`) gets a fixed width instead of rich's 80-column default.
    console = Console(width=None if sys.stdout.isatty() else 120)
    t0 = time.monotonic()
    died: TargetDiedError | None = None
    view: LiveView | QuietView
    if verbosity is Verbosity.QUIET:
        view = QuietView()
    else:
        view_type = LiveView if console.is_terminal else PlainView
        view = view_type(console, scenario.budget.trials, verbose=verbosity is Verbosity.VERBOSE)
    with view:
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
    if min_gpu_utilization is not None and scenario.run.report:
        # A report flag, not a goal: the sweep's report is rendered again with the flags.
        from analyzer.report import write_report

        write_report(summary.run_dir, min_gpu_utilization_pct=min_gpu_utilization)
    root = summary.run_dir
    recommendation = summary.data.get("recommendation") or {}
    if verbosity is Verbosity.QUIET:
        # The answer alone: the gain sentence and where the config to deploy is.
        if summary.best is not None:
            console.print(summary.data.get("gain_text", ""), highlight=False, markup=False)
        if summary.best_config_path:
            console.print(f"best config: {summary.best_config_path}", highlight=False)
        if recommendation.get("candidate_config"):
            console.print(
                f"candidate: {root / recommendation['candidate_config']}", highlight=False
            )
    else:
        if verbosity is Verbosity.VERBOSE and isinstance(view, LiveView) and view.rows:
            console.print(trials_table(view.rows, title="every trial"))
        _print_summary(console, summary, scenario, time.monotonic() - t0)
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
        goals = LoadPlan(scenario).goals
        if goals.token_goals:
            raise GoalNotMetError(
                f"no config met {goals.describe()}; relax --ttft-p99-ms/--itl-p99-ms or widen "
                f"the space ({root})"
            )
        raise GoalNotMetError(
            f"no config met p99 <= {scenario.goals.p99_ms:g} ms; relax --p99-ms or widen the space ({root})"
        )


def _print_summary(
    console: Console, summary: SweepOutcome, scenario: Scenario, elapsed_s: float
) -> None:
    """The table, sentences and paths a run ends with (all but ``--quiet``)."""
    console.print(summary_table(summary, LoadPlan(scenario).goals))
    if (note := ceiling_note(summary, scenario)) is not None:
        console.print(f"[bold yellow]{note}[/]", highlight=False)
    # The same sentences as summary.json and the report's verdict (gain with its interval).
    console.print(summary.data.get("goal_text", ""), highlight=False)
    console.print(
        f"[bold]{summary.data.get('gain_text', 'gain over baseline: n/a')}[/]\n"
        f"trials: {trials_text(summary.trials)}   stopped by: {summary.stop_reason}   "
        f"({elapsed_s:.0f} s)",
        highlight=False,
    )
    if summary.data.get("search_note"):
        console.print(f"search: {summary.data['search_note']}", highlight=False, markup=False)
    if note := (summary.data.get("batching") or {}).get("note"):
        console.print(f"[bold yellow]{escape(note)}[/]", highlight=False)
    if summary.data.get("tie_break"):
        console.print(f"tie: {summary.data['tie_break']}", highlight=False, markup=False)
    console.print(phases_line(summary), highlight=False)
    root = summary.run_dir
    recommendation = summary.data.get("recommendation") or {}
    if recommendation.get("candidate_config"):
        # The one recommendation rule (sweep._recommend): only a significant gain is applied.
        console.print(
            f"[bold yellow]recommended: {escape(recommendation['detail'])}[/]", highlight=False
        )
    elif recommendation.get("config") == "best":
        console.print(f"recommended: {recommendation['detail']}", highlight=False, markup=False)
    if summary.best_config_path:
        console.print(f"best config:  {summary.best_config_path}", highlight=False)
    if recommendation.get("candidate_config"):
        console.print(f"candidate:    {root / recommendation['candidate_config']}", highlight=False)
    report = summary.data.get("files", {}).get("report")
    console.print(
        f"summary:      {root / 'summary.json'}\nreport:       "
        + (str(root / report) if report else f"not rendered (perfsweep report {root})"),
        highlight=False,
    )
