"""``perfsweep load``: measure a running KServe v2 server at fixed loads, or find its capacity.

Examples::

    perfsweep load --url 127.0.0.1:8000 --model m --concurrency 1,8,32
    perfsweep load --url 127.0.0.1:8000 --model m --request-rate 100,200,400 --arrival constant
    perfsweep load --url 127.0.0.1:8000 --model m --find-capacity --p99-ms 100 --output cap.json
    perfsweep load ... --request-rate 200 --arrival mmpp:4@0.5,0.25@2   # on/off bursts
    perfsweep load ... --trace requests.csv --trace-scale 0.5,1,2       # replay, scaled in rate
    perfsweep load ... --workers 2                      # Locust master + 2 local worker processes
    perfsweep load ... --master --expect-workers 4 --master-bind-host 0.0.0.0   # across machines
    perfsweep load --worker --master-host 10.0.0.5      # on each load machine
    perfsweep load ... --input-data data.json --shape IDS:128   # perf_analyzer's --input-data
    perfsweep load ... --unique-payloads 10000 --repeat-ratio 0.3  # exercise a response cache
    perfsweep load ... --mix a=3,b=1 --find-capacity --p99-ms 50   # two models served together
    perfsweep load ... --mix a=3@100,b=1@40 --find-capacity         # each held to its own p99

Exit codes: 0 done, 1 ``--find-capacity`` found no rate meeting the goal, 2 bad input, 3 the target
failed.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from analyzer.commands.input_flags import (
    ArrivalFlag,
    BatchSizeFlag,
    HeaderFileFlag,
    HeaderFlag,
    InputDataFlag,
    MixFlag,
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
    access_overrides,
    input_overrides,
    mix_overrides,
    traffic_overrides,
)
from analyzer.config.scenario import load_scenario
from analyzer.config.sections import InputSection
from analyzer.errors import GoalNotMetError, InputError
from analyzer.load.engine import engine_options, input_options
from analyzer.measure.arrivals import fit_gaps
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.generator import load_output_dict
from analyzer.measure.goals import classes_text
from analyzer.measure.measurement import Measurement, WindowStats
from analyzer.measure.specs import CapacitySpec, Goals, LoadMode, LoadSpec


def _numbers(text: str | None, what: str) -> list[float]:
    if not text:
        return []
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise InputError(
            f"{what} takes comma-separated numbers, e.g. 1,8,32; got {text!r}"
        ) from exc
    if not values or any(v <= 0 for v in values):
        raise InputError(f"{what} needs positive numbers, got {text!r}")
    return values


def environment_record(
    url: str,
    model: str,
    protocol: str,
    workers: int,
    inputs: InputSection | None = None,
    mix: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Where the measurement ran, and with which input data (stored in the output JSON); a mix
    of models: each model's share, and the rates the models that hold one hold."""
    versions: dict[str, str | None] = {}
    for pkg in ("perfsweep", "locust", "tritonclient", "gevent", "grpcio"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "packages": versions,
        "target_url": url,
        "model": model,
        "protocol": protocol,
        "generator_processes": workers,
        "input": _input_record(inputs) if inputs is not None else None,
        **({"mix": {c["model"]: c.get("share", 0.0) for c in mix}} if mix else {}),
        **(
            {"mix_rates_rps": {c["model"]: c["rate_rps"] for c in mix if c.get("rate_rps")}}
            if any(c.get("rate_rps") for c in mix)
            else {}
        ),
    }


def _input_record(section: InputSection) -> dict[str, Any]:
    """The request data as the generator builds it (``InputOptions``), and the data file's
    sha256 (the same path with other bytes is another measurement)."""
    record = input_options(section).to_dict()
    record["data_sha256"] = section.data_sha256
    return record


def _num(value: float) -> str:
    """Three significant-ish digits that stay narrow: 3.21, 85.5, 1235."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _level(m: Measurement | LoadSpec) -> str:
    return f"{m.target:g}/s" if m.mode is LoadMode.REQUEST_RATE else f"c={m.target:g}"


def results_table(measurements: list[Measurement], title: str = "perfsweep load") -> Table:
    """The final table: one row per load level (fits 80 columns)."""
    table = Table(
        title=f"{title} (latency ms, server times us)",
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        show_edge=False,
    )
    for name in (
        "level",
        "req/s",
        "p50",
        "p90",
        "p99",
        "n",
        "err",
        "lag99",
        "batch",
        "queue",
        "infer",
        "verdict",
    ):
        table.add_column(name, justify="left" if name in ("level", "verdict") else "right")
    for m in measurements:
        server = m.server
        if not m.valid:
            verdict = "[red]INVALID"
        elif m.stopped_early:
            verdict = "[yellow]stop"
        elif not m.stable:
            verdict = "[yellow]unst."
        else:
            verdict = "[green]ok"
        table.add_row(
            _level(m),
            _num(m.throughput_rps),
            _num(m.p50_ms),
            _num(m.p90_ms),
            _num(m.p99_ms),
            str(m.request_count),
            str(m.error_count),
            f"{m.send_lag_p99_ms:.1f}" if m.mode is LoadMode.REQUEST_RATE else "-",
            f"{server.avg_batch_size:.2f}" if server else "-",
            f"{server.queue_us:.0f}" if server else "-",
            f"{server.compute_infer_us:.0f}" if server else "-",
            verdict,
        )
    return table


class _LiveWindows:
    """A live table of the windows of the level being measured."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.rows: list[tuple[LoadSpec, WindowStats]] = []
        self.live = Live(self._render(), console=console, auto_refresh=False, transient=True)

    def _render(self) -> Table:
        table = Table(
            title="windows (live)", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False
        )
        for name in (
            "level",
            "#",
            "s",
            "req/s",
            "p50 ms",
            "p99 ms",
            "lag p99",
            "cpu %",
            "in flight",
        ):
            table.add_column(name, justify="right")
        for spec, w in self.rows[-10:]:
            table.add_row(
                _level(spec),
                str(w.index),
                f"{w.duration_s:.1f}",
                f"{w.throughput_rps:.1f}",
                f"{w.p50_ms:.2f}",
                f"{w.p99_ms:.2f}",
                f"{w.send_lag_p99_ms:.2f}",
                f"{w.generator_cpu_pct:.0f}",
                str(w.max_in_flight),
            )
        return table

    def __call__(self, spec: LoadSpec, window: WindowStats) -> None:
        self.rows.append((spec, window))
        self.live.update(self._render(), refresh=True)


def register(app: typer.Typer) -> None:
    """Add ``perfsweep load`` to ``app``."""

    @app.command("load")
    def load(
        url: Annotated[
            str, typer.Option(help="target HOST:PORT (HTTP or gRPC per --protocol)")
        ] = "127.0.0.1:8000",
        model: Annotated[
            str, typer.Option(help="model name (with --mix: the first of the mix's by default)")
        ] = "",
        protocol: Annotated[str, typer.Option(help="http or grpc")] = "http",
        concurrency: Annotated[
            str | None, typer.Option(help="closed-loop levels, e.g. 1,8,32")
        ] = None,
        request_rate: Annotated[
            str | None, typer.Option(help="open-loop levels in req/s, e.g. 100,200,400")
        ] = None,
        arrival: ArrivalFlag = None,
        mix: MixFlag = None,
        trace: TraceFlag = None,
        trace_unit: TraceUnitFlag = None,
        trace_scale: Annotated[
            str | None,
            typer.Option(
                help="--trace: levels as multiples of the trace's recorded rate, e.g. 0.5,1,2 "
                "(default 1: as recorded)"
            ),
        ] = None,
        find_capacity: Annotated[
            bool, typer.Option("--find-capacity", help="search the highest rate meeting --p99-ms")
        ] = False,
        p99_ms: Annotated[float | None, typer.Option(help="p99 goal in ms")] = None,
        max_error_rate: Annotated[float, typer.Option(help="error-rate goal (fraction)")] = 0.0,
        start_rps: Annotated[float, typer.Option(help="capacity search: first rate")] = 10.0,
        max_rps: Annotated[float, typer.Option(help="capacity search: highest rate")] = 100_000.0,
        resolution: Annotated[
            float, typer.Option(help="capacity search: relative precision")
        ] = 0.05,
        confirm_failures: Annotated[
            bool,
            typer.Option(help="capacity search: repeat a failing step before it counts"),
        ] = True,
        window_s: Annotated[float, typer.Option(help="window length, seconds")] = 3.0,
        window_requests: Annotated[
            int | None, typer.Option(help="window length in requests (instead of --window-s)")
        ] = None,
        warmup_s: Annotated[float, typer.Option(help="warm-up per level, seconds")] = 1.0,
        max_windows: Annotated[
            int | None,
            typer.Option(help="windows per level at most [default: 10, capacity steps 4]"),
        ] = None,
        stability_pct: Annotated[float, typer.Option(help="stability tolerance, percent")] = 10.0,
        workers: Annotated[int, typer.Option(help="local generator processes")] = 1,
        master: Annotated[
            bool, typer.Option("--master", help="be a Locust master for remote workers")
        ] = False,
        expect_workers: Annotated[
            int, typer.Option(help="--master: remote workers to wait for")
        ] = 1,
        master_bind_host: Annotated[str, typer.Option(help="--master: bind address")] = "127.0.0.1",
        master_port: Annotated[int, typer.Option(help="master port (0 = free port)")] = 5557,
        worker: Annotated[
            bool, typer.Option("--worker", help="be a Locust worker of a --master")
        ] = False,
        master_host: Annotated[str, typer.Option(help="--worker: master address")] = "127.0.0.1",
        input_data: InputDataFlag = None,
        batch_size: BatchSizeFlag = None,
        shape: ShapeFlag = None,
        unique_payloads: UniquePayloadsFlag = None,
        repeat_ratio: RepeatRatioFlag = None,
        shared_memory: SharedMemoryFlag = None,
        seed: Annotated[int, typer.Option(help="seed of arrivals and random inputs")] = 0,
        pool_size: Annotated[
            int, typer.Option(help="open loop: in-flight requests per process")
        ] = 512,
        metrics_url: Annotated[
            str | None, typer.Option(help="Prometheus URL (default: http://URL/metrics if any)")
        ] = None,
        stats_url: Annotated[
            str | None, typer.Option(help="HTTP HOST:PORT for statistics when --protocol grpc")
        ] = None,
        output: Annotated[Path | None, typer.Option(help="write results JSON here")] = None,
        ssl_ca: SslCaFlag = None,
        ssl_cert: SslCertFlag = None,
        ssl_key: SslKeyFlag = None,
        ssl_insecure: SslInsecureFlag = False,
        header: HeaderFlag = None,
        header_file: HeaderFileFlag = None,
    ) -> None:
        """Measure throughput and exact latency percentiles of a KServe v2 / Triton model."""
        if worker:
            from analyzer.load.worker import run_worker

            run_worker(master_host, master_port)
            return
        mixed = mix_overrides(mix)
        if not model and mixed:
            model = mixed["traffic.classes"][0]["model"]
        own = [c["p99_ms"] for c in mixed.get("traffic.classes", ()) if c["p99_ms"]]
        if p99_ms is None and own and len(own) == len(mixed["traffic.classes"]):
            p99_ms = max(own)  # every model has its own goal (--mix a=3@100,b=1@40)
        if not model:
            raise InputError("--model NAME is required")
        if protocol not in ("http", "grpc"):
            raise InputError(f"--protocol must be http or grpc, got {protocol!r}")
        from analyzer.config.urls import http_url

        url = http_url(url)  # the one check of every URL; https:// is spoken over TLS
        # The same [input] and [traffic] keys as a scenario's, checked the same way (bad values
        # end here, before any load); load reads no scenario file and no PERFSWEEP_* variables.
        scenario = load_scenario(
            None,
            {
                **input_overrides(
                    shape, input_data, batch_size, unique_payloads, repeat_ratio, shared_memory
                ),
                **traffic_overrides(arrival, trace, trace_unit),
                **mixed,
                **({"goals.p99_ms": p99_ms} if p99_ms is not None else {}),
                "model.url": url,
                **access_overrides(
                    None, ssl_ca, ssl_cert, ssl_key, ssl_insecure, header, header_file
                ),
            },
            env={},
        )
        scenario.model.access().check()
        if scenario.model.ssl_insecure:
            Console(stderr=True).print(
                f"--ssl-insecure: the certificate of {url} is not verified", highlight=False
            )
        input_options(scenario.input, seed)  # the generator's own checks, before any load
        process = scenario.traffic.arrival_process()
        levels_c = _numbers(concurrency, "--concurrency")
        levels_r = _numbers(request_rate, "--request-rate")
        if trace_scale is not None and process.trace is None:
            raise InputError("--trace-scale scales a --trace; give the trace too")
        if process.trace is not None:
            if levels_c:
                raise InputError("--trace replays open-loop sends; it cannot go with --concurrency")
            if trace_scale is not None or not (levels_r or find_capacity):
                scales = _numbers(trace_scale or "1", "--trace-scale")
                if levels_r or find_capacity:
                    raise InputError(
                        "give --trace-scale or --request-rate / --find-capacity, not both"
                    )
                levels_r = [s * process.trace.rate_rps for s in scales]
            fit = fit_gaps(process.trace.gaps_s)
            Console(stderr=True).print(
                f"trace {process.trace.source}: {fit.describe()}", highlight=False
            )
        if sum(bool(x) for x in (levels_c, levels_r, find_capacity)) != 1:
            raise InputError("give exactly one of --concurrency, --request-rate or --find-capacity")
        if find_capacity and p99_ms is None:
            raise InputError(
                "--find-capacity needs a goal: --p99-ms X (or each --mix model's @P99)"
            )
        goals = (
            Goals(p99_ms, max_error_rate, classes=scenario.traffic.class_goals())
            if p99_ms is not None
            else None
        )

        if max_windows is None:
            max_windows = 4 if find_capacity else 10
        step = LoadSpec(
            LoadMode.REQUEST_RATE,
            1.0,
            arrival=process,
            warmup_s=warmup_s,
            window_s=window_s,
            window_requests=window_requests,
            max_windows=max_windows,
            stability_pct=stability_pct,
            seed=seed,
        )
        console = Console(stderr=True)
        live = _LiveWindows(console)

        metrics_url = http_url(metrics_url) if metrics_url else metrics_url
        stats_url = http_url(stats_url) if stats_url else stats_url

        from analyzer.load import LocustLoadGenerator  # gevent: only from here on

        options = engine_options(
            scenario,
            url,
            model,
            metrics_url=metrics_url,
            protocol=protocol,
            workers=workers,
            expect_remote_workers=expect_workers if master else 0,
            master_bind_host=master_bind_host,
            master_port=master_port if master else 0,
            pool_size=pool_size,
            stats_url=stats_url,
            on_window=live,
        )
        measurements: list[Measurement] = []
        capacity: CapacityResult | None = None
        with live.live, LocustLoadGenerator(options) as generator:
            if find_capacity:
                assert goals is not None
                capacity = generator.find_capacity(
                    CapacitySpec(
                        goals=goals,
                        start_rps=start_rps,
                        max_rps=max_rps,
                        min_rps=min(1.0, start_rps),
                        resolution=resolution,
                        step=step,
                        confirm_failures=confirm_failures,
                    )
                )
                measurements = list(capacity.points)
            else:
                mode = LoadMode.CONCURRENCY if levels_c else LoadMode.REQUEST_RATE
                for target in levels_c or levels_r:
                    spec = LoadSpec(
                        mode,
                        target,
                        arrival=step.arrival,
                        warmup_s=warmup_s,
                        window_s=window_s,
                        window_requests=window_requests,
                        max_windows=max_windows,
                        stability_pct=stability_pct,
                        seed=seed,
                    )
                    measurements.append(generator.measure(spec))
                    generator.drain(30.0)

        out = Console()
        if not out.is_terminal:  # piped or captured: never truncate the numbers to 80 columns
            out = Console(width=160)
        out.print(results_table(measurements))
        for m in measurements:
            if m.classes:
                out.print(f"[dim]{_level(m)}:[/] {classes_text(m, goals)}", highlight=False)
            for message in m.messages:
                out.print(f"[dim]{m.mode.value} {m.target:g}:[/] {message}", highlight=False)
        if capacity is not None:
            out.print(f"[bold]{capacity.message}[/]", highlight=False)
        if output is not None:
            doc = load_output_dict(
                measurements,
                capacity,
                environment_record(
                    url, model, protocol, workers, scenario.input, mixed.get("traffic.classes", ())
                ),
            )
            output.parent.mkdir(parents=True, exist_ok=True)
            tmp = output.with_suffix(output.suffix + ".tmp")
            tmp.write_text(json.dumps(doc, indent=2))
            tmp.replace(output)
            out.print(f"results written to {output}")
        if capacity is not None and capacity.capacity_rps == 0:
            raise GoalNotMetError(capacity.message)
