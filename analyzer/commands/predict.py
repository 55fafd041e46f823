"""``perfsweep predict``: what a config would do at a rate, or its capacity.

The profile comes from a run directory, a profile file, or (``--url``) a short profile phase
against a running server, which asks it for batches of chosen sizes and is then left on the
model's config as it was found.

Exit codes: 0 answered, 2 bad flags, no usable profile, or a config that needs batch sizes
beyond the profiled ones (predictions never extrapolate), 3 the server (``--url``) failed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from analyzer.commands.input_flags import (
    ArrivalFlag,
    BatchSizeFlag,
    HeaderFileFlag,
    HeaderFlag,
    InputDataFlag,
    ShapeFlag,
    SslCaFlag,
    SslCertFlag,
    SslInsecureFlag,
    SslKeyFlag,
    TraceFlag,
    TraceUnitFlag,
    access_overrides,
    input_overrides,
    traffic_overrides,
)
from analyzer.errors import InputError


def _sizes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(p) for p in text.replace(" ", ",").split(",") if p)
    except ValueError as exc:
        raise InputError(f"--preferred must be sizes like 8,16 (got {text!r})") from exc


def register(app: typer.Typer) -> None:
    """Add the ``predict`` command to ``app``."""

    @app.command("predict")
    def predict(
        run_dir: Annotated[
            Path | None,
            typer.Argument(help="Run directory of `perfsweep run` (profile + default config)."),
        ] = None,
        rate: Annotated[
            float | None,
            typer.Option("--rate", help="Predict p50/p99 and batch sizes at this req/s."),
        ] = None,
        p99_ms: Annotated[
            float | None, typer.Option("--p99-ms", help="Predict the capacity at this p99 goal.")
        ] = None,
        max_batch_size: Annotated[int | None, typer.Option("--max-batch-size")] = None,
        max_queue_delay_us: Annotated[int | None, typer.Option("--max-queue-delay-us")] = None,
        preferred: Annotated[
            str | None, typer.Option("--preferred", help="Preferred batch sizes, e.g. 8,16.")
        ] = None,
        instances: Annotated[int | None, typer.Option("--instances")] = None,
        profile: Annotated[
            Path | None,
            typer.Option(
                "--profile",
                help="Profile JSON (perfsweep.profile) or simulated-device TOML instead of the "
                "run's statistics.",
            ),
        ] = None,
        url: Annotated[
            str | None,
            typer.Option(
                "--url",
                help="Probe this running server's model for the profile (a few hundred "
                "requests); its current config is the default config.",
            ),
        ] = None,
        model: Annotated[
            str | None, typer.Option("--model", help="The model to probe (with --url).")
        ] = None,
        save_profile: Annotated[
            Path | None,
            typer.Option("--save-profile", help="Write the profile used as JSON (for --profile)."),
        ] = None,
        input_data: InputDataFlag = None,
        shape: ShapeFlag = None,
        batch_size: BatchSizeFlag = None,
        seed: Annotated[int, typer.Option("--seed", help="Simulation seed.")] = 0,
        arrival: ArrivalFlag = None,
        trace: TraceFlag = None,
        trace_unit: TraceUnitFlag = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
        ssl_ca: SslCaFlag = None,
        ssl_cert: SslCertFlag = None,
        ssl_key: SslKeyFlag = None,
        ssl_insecure: SslInsecureFlag = False,
        header: HeaderFlag = None,
        header_file: HeaderFileFlag = None,
    ) -> None:
        """Predict a config's latency at a rate, or its capacity, from a profile (a run's, a
        file's, or one probed from a live server with --url: with --input-data, --shape and
        --batch-size it sends the load's request data, as `perfsweep run` does)."""
        from analyzer.config.scenario import load_scenario
        from analyzer.predict.planner import PlanRequest, plan, render_text

        given = load_scenario(
            None,
            {
                **input_overrides(shape, input_data, batch_size),
                **traffic_overrides(arrival, trace, trace_unit),
                "model.url": url,
                **access_overrides(
                    None, ssl_ca, ssl_cert, ssl_key, ssl_insecure, header, header_file
                ),
            },
        )
        inputs = None
        if any(v is not None for v in (input_data, shape, batch_size)):
            from analyzer.load.engine import input_options

            inputs = input_options(given.input, given.run.seed)
        report = plan(
            PlanRequest(
                run_dir=run_dir,
                profile_path=profile,
                rate_rps=rate,
                p99_ms=p99_ms,
                max_batch_size=max_batch_size,
                max_queue_delay_us=max_queue_delay_us,
                preferred_batch_size=_sizes(preferred),
                instance_count=instances,
                seed=seed,
                url=url,
                model=model,
                access=given.model.access().check(),
                inputs=inputs,
                save_profile=save_profile,
                arrival=given.traffic.arrival_process(),
            )
        )
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            Console().print(render_text(report), highlight=False, soft_wrap=True, markup=False)
