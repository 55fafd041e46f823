"""``perfsweep gate``: a CI performance gate with honest statistics.

Judge a result that exists::

    perfsweep gate reports/run-1 --p99-ms 100 --min-throughput-rps 500 --max-error-rate 0.001
    perfsweep gate new.json --baseline old.json --max-regression 5%

or measure and judge in one step (the managed reference server, or a running one with ``--url``)::

    perfsweep gate --model resnet50 --device sim --rate-rps 60 --p99-ms 80 --repeats 3
    perfsweep gate --url http://127.0.0.1:8000 --model m --scenario gate.toml \\
        --baseline-url http://127.0.0.1:9000 --max-regression 5% --repeats 5

With two live targets the measurements alternate (baseline, candidate, candidate, baseline, ...)
so that drift of the machine hits both alike. Criteria come from flags, else the ``[gate]`` table
of ``--scenario``, else ``./perfsweep.toml``'s ``[gate]``; in measure mode with none of these the
scenario's ``[goals]`` are used.

Outputs: a console table; Markdown (``--markdown FILE``, and appended to ``$GITHUB_STEP_SUMMARY``
when set); JUnit XML (``--junit FILE``), one test case per criterion. Exit codes: 0 pass, 1 a
criterion failed, 2 bad usage or input, 3 the target failed.

This module parses the flags into an :class:`analyzer.gate.run.GateCommand`, calls
:func:`analyzer.gate.run.run_gate` and maps the report to an exit code; the measurement, its
retry policy and the criteria precedence live in :mod:`analyzer.gate.run`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from analyzer.commands.help import (
    GOALS,
    MEASUREMENT,
    OUTPUT,
    SERVER,
    TRAFFIC,
    Device,
    epilog,
    from_scenario,
    value,
)
from analyzer.commands.input_flags import (
    BatchSizeFlag,
    DatasetFlag,
    ExpectWorkersFlag,
    GrpcUrlFlag,
    HeaderFileFlag,
    HeaderFlag,
    InputDataFlag,
    InputTokensFlag,
    MasterBindHostFlag,
    MasterPortFlag,
    MetricsUrlFlag,
    OutputTokensFlag,
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
)
from analyzer.commands.names import command_class
from analyzer.config.urls import http_url
from analyzer.errors import GoalNotMetError, InputError
from analyzer.gate.plan import GateFlags, MeasureRequest
from analyzer.gate.run import GateCommand, run_gate


def parse_fraction(text: str) -> float:
    """``5%`` -> 0.05; ``0.05`` -> 0.05."""
    raw = text.strip()
    try:
        return float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError as exc:
        raise InputError(
            f"--max-regression takes a percentage like 5% (or 0.05), got {text!r}"
        ) from exc


EXAMPLES = epilog(
    [
        (
            "perfsweep gate reports/run-1 --p99-ms 100 --min-throughput-rps 500 "
            "--max-error-rate 0.001",
            "judge a run directory against absolute goals",
        ),
        (
            "perfsweep gate new.json --baseline old.json --max-regression 5%",
            "judge a perfsweep load --output file against an earlier one",
        ),
        (
            "perfsweep gate --model resnet50 --device sim --rate-rps 60 --p99-ms 80 --repeats 3",
            "measure the managed server now, then judge",
        ),
        (
            "perfsweep gate --url http://127.0.0.1:8000 --model m --rate-rps 100 "
            "--baseline-url http://127.0.0.1:9000 --max-regression 5% --repeats 5",
            "two live servers, measured in turn, the candidate against the baseline",
        ),
    ],
    "Exit status: 0 pass, 1 a criterion failed, 2 bad usage or input, 3 the server failed. "
    "Criteria: flags, else the [gate] table of --scenario, else ./perfsweep.toml's [gate], "
    "else (when measuring) the scenario's [goals].",
)


def register(app: typer.Typer) -> None:
    """Add ``perfsweep gate`` to ``app``."""

    @app.command("gate", cls=command_class("gate"), epilog=EXAMPLES)
    def gate(
        result: Annotated[
            Path | None,
            typer.Argument(
                help="Run directory, summary.json or `perfsweep load --output` file "
                "(omit to measure now)."
            ),
        ] = None,
        p99_ms: Annotated[
            float | None,
            typer.Option(
                help="Fail when p99 > this (ms).",
                show_default="the [gate] table's p99_ms",
                rich_help_panel=GOALS,
            ),
        ] = None,
        min_throughput_rps: Annotated[
            float | None,
            typer.Option(
                help="Fail when throughput < this (req/s).",
                show_default="the [gate] table's min_throughput_rps",
                rich_help_panel=GOALS,
            ),
        ] = None,
        max_error_rate: Annotated[
            float | None,
            typer.Option(
                help="Fail when the failed fraction > this.",
                show_default="the [gate] table's max_error_rate",
                rich_help_panel=GOALS,
            ),
        ] = None,
        ttft_p99_ms: Annotated[
            float | None,
            typer.Option(
                help="Token streams: fail when time to first token p99 > this (ms).",
                show_default="the [gate] table's ttft_p99_ms",
                rich_help_panel=GOALS,
            ),
        ] = None,
        itl_p99_ms: Annotated[
            float | None,
            typer.Option(
                help="Token streams: fail when inter-token latency p99 > this (ms).",
                show_default="the [gate] table's itl_p99_ms",
                rich_help_panel=GOALS,
            ),
        ] = None,
        min_tokens_per_s: Annotated[
            float | None,
            typer.Option(
                help="Token streams: fail when output tokens/s < this.",
                show_default="the [gate] table's min_tokens_per_s",
                rich_help_panel=GOALS,
            ),
        ] = None,
        baseline: Annotated[
            Path | None,
            typer.Option(
                help="Baseline result to compare with.",
                show_default="the [gate] table's baseline",
                rich_help_panel=GOALS,
            ),
        ] = None,
        max_regression: Annotated[
            str | None,
            typer.Option(
                metavar="<PCT%|FRACTION>",
                help="Tolerated worsening vs the baseline, e.g. 5% (significance needed).",
                show_default="the [gate] table's max_regression_pct",
                rich_help_panel=GOALS,
            ),
        ] = None,
        alpha: Annotated[
            float | None,
            typer.Option(
                help="Significance level of the regression test.",
                show_default=from_scenario("gate.alpha"),
                rich_help_panel=GOALS,
            ),
        ] = None,
        force: Annotated[
            bool,
            typer.Option(
                "--force",
                help="Compare results from different environments anyway.",
                rich_help_panel=GOALS,
            ),
        ] = False,
        level: Annotated[
            float | None,
            typer.Option(
                help="Load level (target) to judge in a load result.",
                show_default="its only level",
                rich_help_panel=GOALS,
            ),
        ] = None,
        scenario_file: Annotated[
            Path | None,
            typer.Option(
                "--scenario",
                help="Scenario TOML (load level, windows, \\[gate] table).",
                rich_help_panel=SERVER,
            ),
        ] = None,
        url: Annotated[
            str | None,
            typer.Option(
                metavar="<URL|HOST:PORT>",
                help="The HTTP address of a running server to measure.",
                show_default="the managed reference server",
                rich_help_panel=SERVER,
            ),
        ] = None,
        grpc_url: GrpcUrlFlag = None,
        protocol: ProtocolFlag = None,
        metrics_url: MetricsUrlFlag = None,
        model: Annotated[
            str | None,
            typer.Option(
                help="Model to measure.",
                show_default="resnet50, or the scenario's model.name",
                rich_help_panel=SERVER,
            ),
        ] = None,
        model_repository: Annotated[
            Path | None,
            typer.Option(
                help="Model repository for the managed reference server.",
                show_default="the bundled model's",
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
        baseline_url: Annotated[
            str | None,
            typer.Option(
                metavar="<URL|HOST:PORT>",
                help="A live baseline server's HTTP address, measured in turn with the candidate.",
                rich_help_panel=SERVER,
            ),
        ] = None,
        rate_rps: Annotated[
            float | None,
            typer.Option(
                help="Offered load, req/s.",
                show_default="the scenario's traffic.rate_rps, else 10% above --min-throughput-rps",
                rich_help_panel=TRAFFIC,
            ),
        ] = None,
        concurrency: Annotated[
            int | None,
            typer.Option(
                help="Closed-loop users (instead of --rate-rps).",
                show_default="the scenario's traffic.concurrency in closed loop",
                rich_help_panel=TRAFFIC,
            ),
        ] = None,
        arrival: Annotated[
            str | None,
            typer.Option(
                metavar="<PROCESS>",
                help="Arrival process: constant, poisson, gamma:cv=2, mmpp:4@0.5,0.25@2, "
                "ramp:..., diurnal:... (as perfsweep run).",
                show_default="constant, or the scenario's traffic.arrival",
                rich_help_panel=TRAFFIC,
            ),
        ] = None,
        trace: TraceFlag = None,
        trace_unit: TraceUnitFlag = None,
        repeats: Annotated[
            int | None,
            typer.Option(
                help="Measurements per target.",
                show_default=from_scenario("gate.repeats"),
                rich_help_panel=MEASUREMENT,
            ),
        ] = None,
        warmup_s: Annotated[
            float | None,
            typer.Option(
                help="Warm-up per repeat, s.",
                show_default=from_scenario("budget.warmup_s"),
                rich_help_panel=MEASUREMENT,
            ),
        ] = None,
        window_s: Annotated[
            float | None,
            typer.Option(
                help="Window length, s.",
                show_default=from_scenario("budget.window_s"),
                rich_help_panel=MEASUREMENT,
            ),
        ] = None,
        windows: Annotated[
            int | None,
            typer.Option(
                help="Windows per repeat (every repeat runs them all).",
                show_default="2",
                rich_help_panel=MEASUREMENT,
            ),
        ] = None,
        shape: ShapeFlag = None,
        input_data: InputDataFlag = None,
        batch_size: BatchSizeFlag = None,
        unique_payloads: UniquePayloadsFlag = None,
        repeat_ratio: RepeatRatioFlag = None,
        shared_memory: SharedMemoryFlag = None,
        input_tokens: InputTokensFlag = None,
        output_tokens: OutputTokensFlag = None,
        dataset: DatasetFlag = None,
        junit: Annotated[
            Path | None,
            typer.Option(
                help="Write JUnit XML here (one test case per criterion).",
                rich_help_panel=OUTPUT,
            ),
        ] = None,
        markdown: Annotated[
            Path | None,
            typer.Option(
                help="Write the Markdown summary here (also appended to "
                "$GITHUB_STEP_SUMMARY when set).",
                rich_help_panel=OUTPUT,
            ),
        ] = None,
        output: Annotated[
            Path | None,
            typer.Option(
                "--output",
                "-o",
                help="Save the candidate's measurements (a baseline for later gates).",
                rich_help_panel=OUTPUT,
            ),
        ] = None,
        baseline_output: Annotated[
            Path | None,
            typer.Option(help="Save the live baseline's measurements.", rich_help_panel=OUTPUT),
        ] = None,
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
        """Fail CI when a result misses absolute goals or regresses significantly vs a baseline."""
        flags = GateFlags(
            p99_ms=p99_ms,
            min_throughput_rps=min_throughput_rps,
            max_error_rate=max_error_rate,
            max_regression=parse_fraction(max_regression) if max_regression else None,
            alpha=alpha,
            ttft_p99_ms=ttft_p99_ms,
            itl_p99_ms=itl_p99_ms,
            min_tokens_per_s=min_tokens_per_s,
        )
        request = MeasureRequest(
            scenario_file=scenario_file,
            model=model,
            model_repository=model_repository,
            device=value(device),
            url=http_url(url) if url else None,
            baseline=baseline,
            baseline_url=http_url(baseline_url) if baseline_url else None,
            repeats=repeats,
            rate_rps=rate_rps,
            concurrency=concurrency,
            arrival=arrival,
            trace=trace,
            trace_unit=value(trace_unit),
            warmup_s=warmup_s,
            window_s=window_s,
            windows=windows,
            output=output,
            baseline_output=baseline_output,
            metrics_url=metrics_url,
            shape=shape,
            input_data=input_data,
            batch_size=batch_size,
            unique_payloads=unique_payloads,
            repeat_ratio=repeat_ratio,
            shared_memory=value(shared_memory),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            dataset=dataset,
            protocol=value(protocol),
            workers=workers,
            expect_workers=expect_workers,
            master_bind_host=master_bind_host,
            master_port=master_port,
            grpc_url=grpc_url,
            ssl_ca=ssl_ca,
            ssl_cert=ssl_cert,
            ssl_key=ssl_key,
            ssl_insecure=ssl_insecure or None,
            header=header,
            header_file=header_file,
        )
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        command = GateCommand(
            result=result,
            flags=flags,
            request=request,
            level=level,
            force=force,
            junit=junit,
            markdown=markdown,
            step_summary=Path(step_summary) if step_summary else None,
        )
        report = run_gate(command, typer.echo)
        if not report.passed:
            names = ", ".join(r.name for r in report.failures)
            raise GoalNotMetError(f"performance gate failed: {names}")
