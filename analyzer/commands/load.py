"""``perfsweep load``: measure a running KServe v2 server at fixed loads, or find its capacity.

Examples::

    perfsweep load --url 127.0.0.1:8000 --model m --concurrency 1,8,32
    perfsweep load --url 127.0.0.1:8000 --model m --rate-rps 100,200,400 --arrival constant
    perfsweep load --url 127.0.0.1:8000 --model m --find-capacity --p99-ms 100 --output cap.json
    perfsweep load ... --rate-rps 200 --arrival mmpp:4@0.5,0.25@2   # on/off bursts
    perfsweep load ... --trace requests.csv --trace-scale 0.5,1,2   # replay, scaled in rate
    perfsweep load ... --workers 2                      # Locust master + 2 local worker processes
    perfsweep load ... --workers auto                   # 1, more while the generator is saturated
    perfsweep load ... --master --expect-workers 4 --master-bind-host 0.0.0.0   # across machines
    perfsweep load --worker --master-host 10.0.0.5      # on each load machine
    perfsweep load ... --input-data data.json --shape IDS:128   # perf_analyzer's --input-data
    perfsweep load ... --unique-payloads 10000 --repeat-ratio 0.3  # exercise a response cache
    perfsweep load ... --mix a=3,b=1 --find-capacity --p99-ms 50   # two models served together
    perfsweep load ... --mix a=3@100,b=1@40 --find-capacity         # each held to its own p99
    perfsweep load --url H:8000 --grpc-url H:8001 --protocol grpc ...   # the load over gRPC
    perfsweep load --url H:8000 --model llm --protocol generate-stream --rate-rps 2 \
        --input-tokens 512 --output-tokens lognormal:mean=128,sd=64   # TTFT, ITL, tokens/s
    perfsweep load --model resnet50 --device sim --rate-rps 50  # starts the reference server
    perfsweep load --url H:8000 --model m --protocol openai --find-capacity \
        --ttft-p99-ms 500 --itl-p99-ms 50          # the highest rate meeting both

``--url`` is the server's HTTP address; with ``--protocol grpc`` the load goes to ``--grpc-url``
(default: the HTTP port + 1) and statistics still come over HTTP. The form from before
``--grpc-url`` still works: ``--url HOST:PORT --protocol grpc`` sends the load to ``--url``
(statistics from the hidden ``--stats-url``).

Exit codes: 0 done, 1 ``--find-capacity`` found no rate meeting the goal, 2 bad input, 3 the target
failed.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import sys
import tempfile
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from analyzer.commands.help import (
    DISTRIBUTED,
    GOALS,
    MEASUREMENT,
    OUTPUT,
    SERVER,
    TRAFFIC,
    Device,
    LoadProtocol,
    epilog,
    value,
)
from analyzer.commands.input_flags import (
    ArrivalFlag,
    BatchSizeFlag,
    DatasetFlag,
    GrpcUrlFlag,
    HeaderFileFlag,
    HeaderFlag,
    InputDataFlag,
    InputTokensFlag,
    ItlP99Flag,
    MetricsUrlFlag,
    MixFlag,
    OutputTokensFlag,
    PadBucketsFlag,
    PadValuesFlag,
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
    generative_lengths,
    generator_overrides,
    input_overrides,
    mix_overrides,
    traffic_overrides,
)
from analyzer.commands.names import command_class
from analyzer.config.scenario import load_scenario
from analyzer.config.sections import BudgetSection, InputSection, stream_protocol
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
    workers: int | str,
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


def tokens_table(measurements: list[Measurement]) -> Table:
    """The token streams of each level (ms; fits 80 columns): TTFT and ITL p50/p99, each
    request's mean ITL at p99, output tokens/s, req/s, goodput (req/s meeting every goal)."""
    table = Table(
        title="token streams (ms)", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False
    )
    for name in (
        "level",
        "ttft50",
        "ttft99",
        "itl50",
        "itl99",
        "mitl99",
        "tok/s",
        "req/s",
        "goodput",
        "tokens",
        "failed",
    ):
        table.add_column(name, justify="left" if name == "level" else "right")
    for m in measurements:
        t = m.tokens
        if t is None:
            continue
        table.add_row(
            _level(m),
            _num(t.ttft_p50_ms),
            _num(t.ttft_p99_ms),
            _num(t.itl_p50_ms),
            _num(t.itl_p99_ms),
            _num(t.mean_itl_p99_ms),
            _num(t.output_tokens_per_s),
            _num(m.throughput_rps),
            _num(t.goodput_rps) if t.goodput_rps is not None else "-",
            str(t.output_tokens),
            str(t.failed_streams),
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


EXAMPLES = epilog(
    [
        ("perfsweep load --url 127.0.0.1:8000 --model m --concurrency 1,8,32", "closed loop"),
        (
            "perfsweep load --url 127.0.0.1:8000 --model m --rate-rps 100,200,400 "
            "--arrival constant",
            "open loop at three rates",
        ),
        (
            "perfsweep load --url 127.0.0.1:8000 --model m --find-capacity --p99-ms 100 "
            "-o cap.json",
            "the highest rate within a p99 goal, written as JSON",
        ),
        (
            "perfsweep load --url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001 --protocol grpc "
            "--model m --rate-rps 200",
            "the load over gRPC, statistics over HTTP",
        ),
        (
            "perfsweep load --url 127.0.0.1:8000 --model m --trace requests.csv "
            "--trace-scale 0.5,1,2",
            "replay a recorded trace at half, once and twice its rate",
        ),
        (
            "perfsweep load --url 127.0.0.1:8000 --mix a=3@100,b=1@40 --find-capacity",
            "two models served together, each held to its own p99",
        ),
        (
            "perfsweep load --url 127.0.0.1:8000 --model m --find-capacity --p99-ms 100 "
            "--master --expect-workers 4 --master-bind-host 0.0.0.0",
            "the load from four machines, each running: perfsweep load --worker --master-host H",
        ),
    ],
    "Exit status: 0 done, 1 --find-capacity found no rate meeting the goal, 2 bad input, "
    "3 the server failed.",
)


def register(app: typer.Typer) -> None:
    """Add ``perfsweep load`` to ``app``."""

    @app.command("load", cls=command_class("load"), epilog=EXAMPLES)
    def load(
        url: Annotated[
            str | None,
            typer.Option(
                metavar="<URL|HOST:PORT>",
                help="The server's HTTP address. With --protocol grpc and no --grpc-url, a "
                "HOST:PORT here is the gRPC address the load goes to.",
                show_default="127.0.0.1:8000",
                rich_help_panel=SERVER,
            ),
        ] = None,
        device: Annotated[
            Device | None,
            typer.Option(
                help="Start the reference server with --model on this device (sim: a "
                "simulated GPU) instead of loading a running one at --url; it stops at the end.",
                rich_help_panel=SERVER,
            ),
        ] = None,
        grpc_url: GrpcUrlFlag = None,
        protocol: Annotated[
            LoadProtocol,
            typer.Option(
                help="What the load speaks: grpc sends it to --grpc-url, while statistics "
                "still come over HTTP from --url. A generative model's token streams: "
                "grpc-stream (Triton's ModelStreamInfer, to --grpc-url), generate-stream "
                "(Triton's generate_stream SSE), openai (/v1/completions), openai-chat "
                "(/v1/chat/completions); these report TTFT, ITL, tokens/s and goodput. With "
                "token goals or lengths, http and grpc mean generate-stream and grpc-stream.",
                rich_help_panel=SERVER,
            ),
        ] = LoadProtocol.http,
        model: Annotated[
            str,
            typer.Option(
                help="Model name (with --mix: the first of the mix's by default).",
                rich_help_panel=SERVER,
            ),
        ] = "",
        metrics_url: MetricsUrlFlag = None,
        stats_url: Annotated[
            str | None,
            # The form before --grpc-url: --url names the gRPC address, this the HTTP one.
            typer.Option(hidden=True),
        ] = None,
        concurrency: Annotated[
            str | None,
            typer.Option(
                metavar="<N,...>",
                help="Closed-loop levels: users, e.g. 1,8,32.",
                rich_help_panel=TRAFFIC,
            ),
        ] = None,
        rate_rps: Annotated[
            str | None,
            typer.Option(
                metavar="<RPS,...>",
                help="Open-loop levels, req/s, e.g. 100,200,400.",
                rich_help_panel=TRAFFIC,
            ),
        ] = None,
        arrival: ArrivalFlag = None,
        trace: TraceFlag = None,
        trace_unit: TraceUnitFlag = None,
        trace_scale: Annotated[
            str | None,
            typer.Option(
                metavar="<X,...>",
                help="--trace: levels as multiples of the trace's recorded rate, e.g. 0.5,1,2.",
                show_default="1: as recorded",
                rich_help_panel=TRAFFIC,
            ),
        ] = None,
        mix: MixFlag = None,
        pool_size: Annotated[
            int,
            typer.Option(
                help="Open loop: in-flight requests per process.", rich_help_panel=TRAFFIC
            ),
        ] = 512,
        find_capacity: Annotated[
            bool,
            typer.Option(
                "--find-capacity",
                help="Search the highest rate meeting --p99-ms (instead of fixed levels).",
                rich_help_panel=GOALS,
            ),
        ] = False,
        p99_ms: Annotated[
            float | None,
            typer.Option(help="P99 latency goal (end to end), ms.", rich_help_panel=GOALS),
        ] = None,
        ttft_p99_ms: TtftP99Flag = None,
        itl_p99_ms: ItlP99Flag = None,
        max_error_rate: Annotated[
            float,
            typer.Option(help="Error-rate goal (a fraction).", rich_help_panel=GOALS),
        ] = 0.0,
        start_rps: Annotated[
            float, typer.Option(help="Capacity search: first rate, req/s.", rich_help_panel=GOALS)
        ] = 10.0,
        max_rps: Annotated[
            float,
            typer.Option(
                "--max-rate-rps",
                help="Capacity search: highest rate, req/s.",
                rich_help_panel=GOALS,
            ),
        ] = 100_000.0,
        resolution: Annotated[
            float,
            typer.Option(
                "--capacity-resolution",
                help="Capacity search: relative precision (as [budget] capacity_resolution).",
                rich_help_panel=GOALS,
            ),
        ] = BudgetSection().capacity_resolution,
        confirm_failures: Annotated[
            bool,
            typer.Option(
                help="Capacity search: repeat a failing step before it counts.",
                rich_help_panel=GOALS,
            ),
        ] = True,
        window_s: Annotated[
            float,
            typer.Option(
                help="Window length, seconds (as [budget] window_s).", rich_help_panel=MEASUREMENT
            ),
        ] = BudgetSection().window_s,
        window_requests: Annotated[
            int | None,
            typer.Option(
                help="Window length in requests (instead of --window-s).",
                rich_help_panel=MEASUREMENT,
            ),
        ] = None,
        warmup_s: Annotated[
            float, typer.Option(help="Warm-up per level, seconds.", rich_help_panel=MEASUREMENT)
        ] = 1.0,
        max_windows: Annotated[
            int | None,
            typer.Option(
                help="Windows per level at most.",
                show_default="10; capacity steps 4",
                rich_help_panel=MEASUREMENT,
            ),
        ] = None,
        stability_pct: Annotated[
            float,
            typer.Option(
                help="Windows agree within this many percent: the level is stable.",
                rich_help_panel=MEASUREMENT,
            ),
        ] = 10.0,
        seed: Annotated[
            int,
            typer.Option(help="Seed of arrivals and random inputs.", rich_help_panel=MEASUREMENT),
        ] = 0,
        input_data: InputDataFlag = None,
        batch_size: BatchSizeFlag = None,
        shape: ShapeFlag = None,
        unique_payloads: UniquePayloadsFlag = None,
        repeat_ratio: RepeatRatioFlag = None,
        shared_memory: SharedMemoryFlag = None,
        pad_buckets: PadBucketsFlag = None,
        pad_values: PadValuesFlag = None,
        input_tokens: InputTokensFlag = None,
        output_tokens: OutputTokensFlag = None,
        dataset: DatasetFlag = None,
        output: Annotated[
            Path | None,
            typer.Option(
                "--output", "-o", help="Write the results as JSON here.", rich_help_panel=OUTPUT
            ),
        ] = None,
        workers: WorkersFlag = None,
        master: Annotated[
            bool,
            typer.Option(
                "--master",
                help="Be a Locust master: the load comes from remote --worker processes.",
                rich_help_panel=DISTRIBUTED,
            ),
        ] = False,
        expect_workers: Annotated[
            int,
            typer.Option(help="--master: remote workers to wait for.", rich_help_panel=DISTRIBUTED),
        ] = 1,
        master_bind_host: Annotated[
            str,
            typer.Option(help="--master: the address to listen on.", rich_help_panel=DISTRIBUTED),
        ] = "127.0.0.1",
        master_port: Annotated[
            int,
            typer.Option(help="The master's port (0 = a free port).", rich_help_panel=DISTRIBUTED),
        ] = 5557,
        worker: Annotated[
            bool,
            typer.Option(
                "--worker",
                help="Be a Locust worker of a --master (its flags decide the load).",
                rich_help_panel=DISTRIBUTED,
            ),
        ] = False,
        master_host: Annotated[
            str, typer.Option(help="--worker: the master's address.", rich_help_panel=DISTRIBUTED)
        ] = "127.0.0.1",
        ssl_ca: SslCaFlag = None,
        ssl_cert: SslCertFlag = None,
        ssl_key: SslKeyFlag = None,
        ssl_insecure: SslInsecureFlag = False,
        header: HeaderFlag = None,
        header_file: HeaderFileFlag = None,
    ) -> None:
        """Measure a running server's throughput and exact latency percentiles, or its capacity."""
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
        token_goals = ttft_p99_ms is not None or itl_p99_ms is not None
        if token_goals or any(v is not None for v in (input_tokens, output_tokens, dataset)):
            # Token goals and lengths are a token stream's: over --protocol http or grpc, the
            # stream each transport speaks (Triton's generate_stream, ModelStreamInfer).
            protocol = LoadProtocol(stream_protocol(protocol.value))
        stream = "" if protocol in (LoadProtocol.http, LoadProtocol.grpc) else protocol.value
        lengths = None
        if stream:
            lengths = generative_lengths(input_tokens, output_tokens, dataset)
            if mixed:
                raise InputError("--mix sends tensors to several models; a token stream is one")
        # The transport: grpc-stream speaks gRPC (its statistics over HTTP), the rest HTTP.
        transport = LoadProtocol.grpc if protocol is LoadProtocol.grpc_stream else protocol
        if stream and transport is not LoadProtocol.grpc:
            transport = LoadProtocol.http
        server = None
        if device is not None:
            if url is not None:
                raise InputError(
                    "--device starts a reference server and --url names a running one: give one"
                )
            from analyzer.target.managed import ManagedServer

            log_path = Path(tempfile.mkdtemp(prefix="perfsweep-load-")) / "server.log"
            server = ManagedServer(model, device.value, log_path)
            Console(stderr=True).print(
                f"starting the reference server ({device.value}); log: {log_path}", highlight=False
            )
            server.start()
            assert server.addresses is not None  # set by start()
            url = server.url
            grpc_url = grpc_url or server.addresses.grpc_url
            metrics_url = metrics_url or server.addresses.metrics_url
        url = url or "127.0.0.1:8000"
        try:
            from analyzer.config.urls import http_url

            # The form from before --grpc-url (`--url HOST:PORT --protocol grpc`, statistics from
            # --stats-url): --url names the gRPC address. An http:// URL is the HTTP address.
            legacy_grpc = (
                protocol is LoadProtocol.grpc
                and grpc_url is None
                and (stats_url is not None or "://" not in url)
            )
            if stats_url is not None and not legacy_grpc:
                raise InputError(
                    "--stats-url goes with --url HOST:PORT --protocol grpc; with --grpc-url, "
                    "--url is the HTTP address statistics come from"
                )
            url = http_url(url)  # the one check of every URL; https:// is spoken over TLS
            # The same [input] and [traffic] keys as a scenario's, checked the same way (bad values
            # end here, before any load); load reads no scenario file and no PERFSWEEP_* variables.
            scenario = load_scenario(
                None,
                {
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
                    **({"goals.p99_ms": p99_ms} if p99_ms is not None else {}),
                    **generator_overrides(workers=workers),
                    "model.url": url,
                    "model.protocol": None if legacy_grpc else transport.value,
                    **access_overrides(
                        grpc_url, ssl_ca, ssl_cert, ssl_key, ssl_insecure, header, header_file
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
            levels_r = _numbers(rate_rps, "--rate-rps")
            if trace_scale is not None and process.trace is None:
                raise InputError("--trace-scale scales a --trace; give the trace too")
            if process.trace is not None:
                if levels_c:
                    raise InputError(
                        "--trace replays open-loop sends; it cannot go with --concurrency"
                    )
                if trace_scale is not None or not (levels_r or find_capacity):
                    scales = _numbers(trace_scale or "1", "--trace-scale")
                    if levels_r or find_capacity:
                        raise InputError(
                            "give --trace-scale or --rate-rps / --find-capacity, not both"
                        )
                    levels_r = [s * process.trace.rate_rps for s in scales]
                fit = fit_gaps(process.trace.gaps_s)
                Console(stderr=True).print(
                    f"trace {process.trace.source}: {fit.describe()}", highlight=False
                )
            if sum(bool(x) for x in (levels_c, levels_r, find_capacity)) != 1:
                raise InputError("give exactly one of --concurrency, --rate-rps or --find-capacity")
            if find_capacity and p99_ms is None and not token_goals:
                raise InputError(
                    "--find-capacity needs a goal: --p99-ms X (or each --mix model's @P99; for a "
                    "token stream --ttft-p99-ms / --itl-p99-ms)"
                )
            goals = (
                Goals(
                    p99_ms if p99_ms is not None else math.inf,
                    max_error_rate,
                    classes=scenario.traffic.class_goals(),
                    ttft_p99_ms=ttft_p99_ms,
                    itl_p99_ms=itl_p99_ms,
                )
                if p99_ms is not None or token_goals
                else None
            )
            if lengths is not None:
                Console(stderr=True).print(f"requests: {lengths.describe()}", highlight=False)

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

            # The old form: the load goes to --url as it is, statistics come from --stats-url.
            legacy: dict[str, Any] = (
                {"protocol": "grpc", "stats_url": stats_url} if legacy_grpc else {}
            )
            generative: dict[str, Any] = (
                {
                    "stream": stream,
                    "lengths": lengths,
                    "goals": goals,
                    # An OpenAI-compatible server has no Triton statistics to read.
                    "scrape_server": not stream.startswith("openai"),
                }
                if stream and lengths is not None
                else {}
            )
            options = engine_options(
                scenario,
                url,
                model,
                metrics_url=metrics_url,
                # --workers N or auto, as run and gate take it ([traffic] workers).
                distributed=True,
                expect_remote_workers=expect_workers if master else 0,
                master_bind_host=master_bind_host,
                master_port=master_port if master else 0,
                pool_size=pool_size,
                on_window=live,
                **legacy,
                **generative,
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
            if any(m.tokens is not None for m in measurements):
                out.print(tokens_table(measurements))
            for m in measurements:
                if m.classes:
                    out.print(f"[dim]{_level(m)}:[/] {classes_text(m, goals)}", highlight=False)
                for message in m.messages:
                    out.print(f"[dim]{m.mode.value} {m.target:g}:[/] {message}", highlight=False)
            if capacity is not None:
                out.print(f"[bold]{capacity.message}[/]", highlight=False)
            if output is not None:
                environment = environment_record(
                    url,
                    model,
                    protocol.value,
                    scenario.traffic.workers,
                    scenario.input,
                    mixed.get("traffic.classes", ()),
                )
                if lengths is not None:  # a generative load: what its requests asked for
                    environment["requests"] = lengths.record()
                doc = load_output_dict(measurements, capacity, environment)
                output.parent.mkdir(parents=True, exist_ok=True)
                tmp = output.with_suffix(output.suffix + ".tmp")
                tmp.write_text(json.dumps(doc, indent=2))
                tmp.replace(output)
                out.print(f"results written to {output}")
            if capacity is not None and capacity.capacity_rps == 0:
                raise GoalNotMetError(capacity.message)
        finally:
            if server is not None:
                server.stop()
