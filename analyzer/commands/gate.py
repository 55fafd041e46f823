"""``perfsweep gate``: a CI performance gate with honest statistics.

Judge a result that exists::

    perfsweep gate reports/run-1 --p99-ms 100 --min-throughput 500 --max-error-rate 0.001
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

from analyzer.commands.input_flags import (
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
)
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


def register(app: typer.Typer) -> None:
    """Add ``perfsweep gate`` to ``app``."""

    @app.command("gate")
    def gate(
        result: Annotated[
            Path | None,
            typer.Argument(
                help="Run directory, summary.json or `perfsweep load --output` file "
                "(omit to measure now)."
            ),
        ] = None,
        p99_ms: Annotated[float | None, typer.Option(help="Fail when p99 > this (ms).")] = None,
        min_throughput: Annotated[
            float | None, typer.Option(help="Fail when throughput < this (req/s).")
        ] = None,
        max_error_rate: Annotated[
            float | None, typer.Option(help="Fail when the failed fraction > this.")
        ] = None,
        baseline: Annotated[
            Path | None, typer.Option(help="Baseline result to compare with.")
        ] = None,
        max_regression: Annotated[
            str | None,
            typer.Option(
                help="Tolerated worsening vs the baseline, e.g. 5% (significance needed)."
            ),
        ] = None,
        alpha: Annotated[
            float | None, typer.Option(help="Significance level of the regression test.")
        ] = None,
        force: Annotated[
            bool,
            typer.Option("--force", help="Compare results from different environments anyway."),
        ] = False,
        level: Annotated[
            float | None, typer.Option(help="Load level (target) to judge in a load result.")
        ] = None,
        junit: Annotated[Path | None, typer.Option(help="Write JUnit XML here.")] = None,
        markdown: Annotated[
            Path | None, typer.Option(help="Write the Markdown summary here.")
        ] = None,
        scenario_file: Annotated[
            Path | None,
            typer.Option("--scenario", help="Scenario TOML (load level, windows, \\[gate] table)."),
        ] = None,
        url: Annotated[
            str | None, typer.Option(help="Measure this running server (HTTP URL).")
        ] = None,
        model: Annotated[str | None, typer.Option(help="Model to measure.")] = None,
        model_repository: Annotated[
            Path | None, typer.Option(help="Model repository for the managed reference server.")
        ] = None,
        device: Annotated[
            str | None, typer.Option(help="auto | cpu | cuda | sim (managed server).")
        ] = None,
        baseline_url: Annotated[
            str | None,
            typer.Option(help="A live baseline server, measured interleaved with the candidate."),
        ] = None,
        repeats: Annotated[
            int | None,
            typer.Option(help="Measurements per target (default: \\[gate] repeats, else 3)."),
        ] = None,
        rate_rps: Annotated[float | None, typer.Option(help="Offered load, req/s.")] = None,
        concurrency: Annotated[
            int | None, typer.Option(help="Closed-loop users (instead of --rate-rps).")
        ] = None,
        arrival: Annotated[
            str | None,
            typer.Option(
                help="Arrival process: constant (default, unless the scenario sets one), poisson, "
                "gamma:cv=2, mmpp:4@0.5,0.25@2, ramp:..., diurnal:... (as perfsweep run)."
            ),
        ] = None,
        trace: TraceFlag = None,
        trace_unit: TraceUnitFlag = None,
        warmup_s: Annotated[float | None, typer.Option(help="Warm-up per repeat, s.")] = None,
        window_s: Annotated[float | None, typer.Option(help="Window length, s.")] = None,
        windows: Annotated[int | None, typer.Option(help="Windows per repeat (default 2).")] = None,
        protocol: ProtocolFlag = None,
        workers: WorkersFlag = None,
        expect_workers: ExpectWorkersFlag = None,
        master_bind_host: MasterBindHostFlag = None,
        master_port: MasterPortFlag = None,
        shape: ShapeFlag = None,
        input_data: InputDataFlag = None,
        batch_size: BatchSizeFlag = None,
        unique_payloads: UniquePayloadsFlag = None,
        repeat_ratio: RepeatRatioFlag = None,
        shared_memory: SharedMemoryFlag = None,
        output: Annotated[
            Path | None,
            typer.Option(help="Save the candidate's measurements (a baseline for later gates)."),
        ] = None,
        baseline_output: Annotated[
            Path | None, typer.Option(help="Save the live baseline's measurements.")
        ] = None,
        metrics_url: MetricsUrlFlag = None,
        grpc_url: GrpcUrlFlag = None,
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
            min_throughput_rps=min_throughput,
            max_error_rate=max_error_rate,
            max_regression=parse_fraction(max_regression) if max_regression else None,
            alpha=alpha,
        )
        request = MeasureRequest(
            scenario_file=scenario_file,
            model=model,
            model_repository=model_repository,
            device=device,
            url=url,
            baseline=baseline,
            baseline_url=baseline_url,
            repeats=repeats,
            rate_rps=rate_rps,
            concurrency=concurrency,
            arrival=arrival,
            trace=trace,
            trace_unit=trace_unit,
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
            shared_memory=shared_memory,
            protocol=protocol,
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
