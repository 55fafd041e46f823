"""``perfsweep ui``: Locust's web dashboard for a Triton-compatible target, with a Server tab.

Examples::

    perfsweep ui --model resnet50 --device sim          # starts the reference server
    perfsweep ui --url 127.0.0.1:8000 --model resnet50  # a running Triton / reference server
    PERFSWEEP_UI_PASSWORD=... perfsweep ui --web-host 0.0.0.0 --web-login --url ...

Exit codes: 0 Locust exited normally, 2 bad or unsafe options, 3 the target failed, 130 Ctrl-C.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from analyzer.commands.input_flags import (
    BatchSizeFlag,
    HeaderFileFlag,
    HeaderFlag,
    InputDataFlag,
    RepeatRatioFlag,
    ShapeFlag,
    SharedMemoryFlag,
    SslCaFlag,
    SslCertFlag,
    SslInsecureFlag,
    SslKeyFlag,
    UniquePayloadsFlag,
    access_overrides,
    input_overrides,
)


def register(app: typer.Typer) -> None:
    """Add ``perfsweep ui`` to ``app``."""

    @app.command("ui")
    def ui(
        url: Annotated[
            str | None,
            typer.Option(
                help="HTTP HOST:PORT of a running server (default: start the reference server)"
            ),
        ] = None,
        model: Annotated[str, typer.Option(help="model to load-test")] = "resnet50",
        device: Annotated[
            str, typer.Option(help="reference server device: auto, cpu, cuda or sim")
        ] = "auto",
        model_repository: Annotated[
            Path | None, typer.Option(help="reference server model repository (default: bundled)")
        ] = None,
        grpc_url: Annotated[
            str | None, typer.Option(help="gRPC HOST:PORT for the gRPC users (default: derived)")
        ] = None,
        metrics_url: Annotated[
            str | None, typer.Option(help="Prometheus URL of the target (default: derived)")
        ] = None,
        web_host: Annotated[
            str, typer.Option(help="dashboard address (other than loopback needs --web-login)")
        ] = "127.0.0.1",
        web_port: Annotated[int, typer.Option(help="dashboard port (0 = a free port)")] = 8089,
        web_login: Annotated[
            bool,
            typer.Option(
                "--web-login", help="require a login (PERFSWEEP_UI_USER / PERFSWEEP_UI_PASSWORD)"
            ),
        ] = False,
        workers: Annotated[int, typer.Option(help="Locust worker processes")] = 1,
        rate_per_user: Annotated[
            float, typer.Option(help="open-loop users: requests/second per user (default in form)")
        ] = 10.0,
        arrival: Annotated[
            str,
            typer.Option(
                help="open-loop users: arrival process, default in the form (poisson, constant, "
                "gamma:cv=2, mmpp:4@0.5,0.25@2, ramp:..., diurnal:...; each user its own stream)"
            ),
        ] = "poisson",
        log_dir: Annotated[
            Path, typer.Option(help="managed server log and repository directory")
        ] = Path("reports/ui"),
        shape: ShapeFlag = None,
        input_data: InputDataFlag = None,
        batch_size: BatchSizeFlag = None,
        unique_payloads: UniquePayloadsFlag = None,
        repeat_ratio: RepeatRatioFlag = None,
        shared_memory: SharedMemoryFlag = None,
        ssl_ca: SslCaFlag = None,
        ssl_cert: SslCertFlag = None,
        ssl_key: SslKeyFlag = None,
        ssl_insecure: SslInsecureFlag = False,
        header: HeaderFlag = None,
        header_file: HeaderFileFlag = None,
    ) -> None:
        """Open Locust's web UI on a Triton target, with live server metrics and config changes."""
        from analyzer.config.scenario import load_scenario
        from analyzer.load.engine import input_fields
        from analyzer.load.web.launcher import UiOptions, run_ui

        # The same request-data flags as run, gate and load, checked the same way.
        flags = input_overrides(
            shape, input_data, batch_size, unique_payloads, repeat_ratio, shared_memory
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

        if device not in ("auto", "cpu", "cuda", "sim"):
            from analyzer.errors import InputError

            raise InputError(f"--device must be auto, cpu, cuda or sim, got {device!r}")
        code = run_ui(
            UiOptions(
                url=url,
                model=model,
                device=device,
                model_repository=model_repository,
                grpc_url=grpc_url,
                metrics_url=metrics_url,
                web_host=web_host,
                web_port=web_port,
                web_login=web_login,
                workers=workers,
                rate_per_user=rate_per_user,
                arrival=arrival,
                log_dir=log_dir,
                inputs=inputs,
                access=access,
            ),
            on_status=typer.echo,  # click flushes each line: tests and wrappers read them live
        )
        if code:
            raise typer.Exit(code)
