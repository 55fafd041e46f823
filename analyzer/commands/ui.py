"""``perfsweep ui``: Locust's web dashboard for a Triton-compatible target, with a Server tab.

Examples::

    perfsweep ui --model resnet50 --device sim          # starts the reference server
    perfsweep ui --url 127.0.0.1:8000 --model resnet50  # a running Triton / reference server
    perfsweep ui --model tinyllm --device sim --protocol openai --input-tokens 128  # token streams
    PERFSWEEP_UI_PASSWORD=... perfsweep ui --web-host 0.0.0.0 --web-login --url ...

Exit codes: 0 Locust exited normally, 2 bad or unsafe options, 3 the target failed, 130 Ctrl-C.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from analyzer.commands.help import (
    OUTPUT,
    SERVER,
    TRAFFIC,
    Choice,
    Device,
    epilog,
    value,
)
from analyzer.commands.input_flags import (
    BatchSizeFlag,
    GrpcUrlFlag,
    HeaderFileFlag,
    HeaderFlag,
    InputDataFlag,
    InputTokensFlag,
    MetricsUrlFlag,
    OutputTokensFlag,
    RepeatRatioFlag,
    ShapeFlag,
    SharedMemoryFlag,
    SslCaUiFlag,
    SslCertFlag,
    SslInsecureFlag,
    SslKeyFlag,
    UniquePayloadsFlag,
    access_overrides,
    input_overrides,
)
from analyzer.commands.names import command_class

#: The panel of the dashboard's own options.
DASHBOARD = "Dashboard"


class StreamProtocol(Choice):
    """``perfsweep ui --protocol``: the generative users' token stream (the HTTP and gRPC
    users of a model answered once are picked in the form)."""

    grpc_stream = "grpc-stream"
    generate_stream = "generate-stream"
    openai = "openai"
    openai_chat = "openai-chat"


EXAMPLES = epilog(
    [
        ("perfsweep ui --model resnet50 --device sim", "starts the reference server, then the UI"),
        (
            "perfsweep ui --url 127.0.0.1:8000 --model resnet50",
            "a running Triton or reference server",
        ),
        (
            "perfsweep ui --model tinyllm --device sim --protocol openai --input-tokens 128 "
            "--output-tokens 32 --ttft-p99-ms 500",
            "a generative model: pick TritonStreamUser; TTFT, ITL, tokens/s and goodput live",
        ),
        (
            "PERFSWEEP_UI_PASSWORD=... perfsweep ui --web-host 0.0.0.0 --web-login "
            "--url 127.0.0.1:8000 --model m",
            "reachable from other machines, behind a login",
        ),
    ],
    "Exit status: 0 Locust exited normally, 2 bad or unsafe options, 3 the server failed, "
    "130 Ctrl-C.",
)


def register(app: typer.Typer) -> None:
    """Add ``perfsweep ui`` to ``app``."""

    @app.command("ui", cls=command_class("ui"), epilog=EXAMPLES)
    def ui(
        url: Annotated[
            str | None,
            typer.Option(
                metavar="<URL|HOST:PORT>",
                help="The HTTP address of a running server.",
                show_default="start the reference server",
                rich_help_panel=SERVER,
            ),
        ] = None,
        grpc_url: GrpcUrlFlag = None,
        metrics_url: MetricsUrlFlag = None,
        model: Annotated[
            str, typer.Option(help="The model to load-test.", rich_help_panel=SERVER)
        ] = "resnet50",
        device: Annotated[
            Device,
            typer.Option(
                help="The reference server's device (sim: a simulated GPU).",
                rich_help_panel=SERVER,
            ),
        ] = Device.auto,
        model_repository: Annotated[
            Path | None,
            typer.Option(
                help="The reference server's model repository.",
                show_default="the bundled model's",
                rich_help_panel=SERVER,
            ),
        ] = None,
        web_host: Annotated[
            str,
            typer.Option(
                help="The dashboard's address (other than loopback needs --web-login).",
                rich_help_panel=DASHBOARD,
            ),
        ] = "127.0.0.1",
        web_port: Annotated[
            int,
            typer.Option(help="The dashboard's port (0 = a free port).", rich_help_panel=DASHBOARD),
        ] = 8089,
        web_login: Annotated[
            bool,
            typer.Option(
                "--web-login",
                help="Require a login (PERFSWEEP_UI_USER / PERFSWEEP_UI_PASSWORD).",
                rich_help_panel=DASHBOARD,
            ),
        ] = False,
        workers: Annotated[
            int, typer.Option(help="Locust worker processes.", rich_help_panel=TRAFFIC)
        ] = 1,
        user_rate_rps: Annotated[
            float,
            typer.Option(
                help="Open-loop users: requests per second each user offers (the form's "
                "starting value).",
                rich_help_panel=TRAFFIC,
            ),
        ] = 10.0,
        arrival: Annotated[
            str,
            typer.Option(
                metavar="<PROCESS>",
                help="Open-loop users: arrival process, the form's starting value (poisson, "
                "constant, gamma:cv=2, mmpp:4@0.5,0.25@2, ramp:..., diurnal:...; each user its "
                "own stream).",
                rich_help_panel=TRAFFIC,
            ),
        ] = "poisson",
        protocol: Annotated[
            StreamProtocol | None,
            typer.Option(
                "--protocol",
                help="Generative users (TritonStream*): the token stream they speak "
                "(grpc-stream to --grpc-url, the rest over HTTP); the form's starting value.",
                show_default="generate-stream",
                rich_help_panel=TRAFFIC,
            ),
        ] = None,
        input_tokens: InputTokensFlag = None,
        output_tokens: OutputTokensFlag = None,
        ttft_p99_ms: Annotated[
            float | None,
            typer.Option(
                "--ttft-p99-ms",
                help="Generative users: the TTFT goal their goodput counts, ms.",
                rich_help_panel=TRAFFIC,
            ),
        ] = None,
        itl_p99_ms: Annotated[
            float | None,
            typer.Option(
                "--itl-p99-ms",
                help="Generative users: the goal of each request's mean ITL that their "
                "goodput counts, ms.",
                rich_help_panel=TRAFFIC,
            ),
        ] = None,
        shape: ShapeFlag = None,
        input_data: InputDataFlag = None,
        batch_size: BatchSizeFlag = None,
        unique_payloads: UniquePayloadsFlag = None,
        repeat_ratio: RepeatRatioFlag = None,
        shared_memory: SharedMemoryFlag = None,
        output_dir: Annotated[
            Path,
            typer.Option(
                help="Where the managed server's log and repository are written.",
                rich_help_panel=OUTPUT,
            ),
        ] = Path("reports/ui"),
        ssl_ca: SslCaUiFlag = None,
        ssl_cert: SslCertFlag = None,
        ssl_key: SslKeyFlag = None,
        ssl_insecure: SslInsecureFlag = False,
        header: HeaderFlag = None,
        header_file: HeaderFileFlag = None,
    ) -> None:
        """Open Locust's web dashboard on a server, with its live metrics and config changes."""
        from analyzer.config.scenario import load_scenario
        from analyzer.load.engine import input_fields
        from analyzer.load.web.launcher import UiOptions, run_ui

        # The same request-data flags as run, gate and load, checked the same way.
        flags = input_overrides(
            shape, input_data, batch_size, unique_payloads, repeat_ratio, value(shared_memory)
        )
        given = any(v is not None for v in flags.values())
        reach = {
            "model.url": url,
            **access_overrides(None, ssl_ca, ssl_cert, ssl_key, ssl_insecure, header, header_file),
        }
        scenario = load_scenario(None, {**flags, **reach}, env={})
        access = scenario.model.access().check()
        inputs: dict[str, Any] = {}
        if given:
            fields = input_fields(scenario.input)
            # Plain values: they reach Locust's processes as JSON (EngineConfig.from_dict).
            inputs = {
                "inputs": fields["inputs"].to_dict(),
                "shared_memory": fields["shared_memory"],
            }

        code = run_ui(
            UiOptions(
                url=url,
                model=model,
                device=device.value,
                model_repository=model_repository,
                grpc_url=grpc_url,
                metrics_url=metrics_url,
                web_host=web_host,
                web_port=web_port,
                web_login=web_login,
                workers=workers,
                rate_per_user=user_rate_rps,
                arrival=arrival,
                log_dir=output_dir,
                inputs=inputs,
                access=access,
                stream=value(protocol),
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                ttft_p99_ms=ttft_p99_ms,
                itl_p99_ms=itl_p99_ms,
            ),
            on_status=typer.echo,  # click flushes each line: tests and wrappers read them live
        )
        if code:
            raise typer.Exit(code)
