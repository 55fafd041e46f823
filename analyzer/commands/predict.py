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

from analyzer.commands.help import OUTPUT, epilog, value
from analyzer.commands.input_flags import (
    ArrivalFlag,
    BatchSizeFlag,
    HeaderFileFlag,
    HeaderFlag,
    InputDataFlag,
    ShapeFlag,
    SslCaHttpFlag,
    SslCertFlag,
    SslInsecureFlag,
    SslKeyFlag,
    TraceFlag,
    TraceUnitFlag,
    access_overrides,
    input_overrides,
    traffic_overrides,
)
from analyzer.commands.names import command_class
from analyzer.errors import InputError

#: The panels of predict's help: what is asked, of which config, from which profile.
QUESTION = "Question"
CONFIG = "The config"
PROFILE = "Profile"


def _sizes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(p) for p in text.replace(" ", ",").split(",") if p)
    except ValueError as exc:
        raise InputError(f"--preferred-batch-size must be sizes like 8,16 (got {text!r})") from exc


EXAMPLES = epilog(
    [
        (
            "perfsweep predict reports/run-1 --rate-rps 300 --max-batch-size 8 "
            "--max-queue-delay-us 1000",
            "p50, p99 and batch sizes of a config at 300 req/s, from a run's profile",
        ),
        (
            "perfsweep predict reports/run-1 --p99-ms 50 --instance-count 2",
            "the capacity of the run's config on two instances within p99 50 ms",
        ),
        (
            "perfsweep predict --profile reference_server/zoo/profiles/resnet50_sim.toml "
            "--rate-rps 100",
            "from a simulated device's profile",
        ),
        (
            "perfsweep predict --url 127.0.0.1:8000 --model m --p99-ms 50 --profile-output m.json",
            "probe a running server for the profile and keep it (--profile m.json reads it)",
        ),
    ],
    "Exit status: 0 answered, 2 bad flags, no usable profile, or a config needing batch sizes "
    "beyond the profiled ones (predictions never extrapolate), 3 the server (--url) failed.",
)


def register(app: typer.Typer) -> None:
    """Add the ``predict`` command to ``app``."""

    @app.command("predict", cls=command_class("predict"), epilog=EXAMPLES)
    def predict(
        run_dir: Annotated[
            Path | None,
            typer.Argument(help="Run directory of `perfsweep run` (profile + default config)."),
        ] = None,
        rate_rps: Annotated[
            float | None,
            typer.Option(
                "--rate-rps",
                help="Predict p50/p99 and batch sizes at this rate, req/s.",
                rich_help_panel=QUESTION,
            ),
        ] = None,
        p99_ms: Annotated[
            float | None,
            typer.Option(
                "--p99-ms",
                help="Predict the capacity within this p99 goal, ms.",
                rich_help_panel=QUESTION,
            ),
        ] = None,
        arrival: ArrivalFlag = None,
        trace: TraceFlag = None,
        trace_unit: TraceUnitFlag = None,
        seed: Annotated[
            int, typer.Option("--seed", help="Simulation seed.", rich_help_panel=QUESTION)
        ] = 0,
        max_batch_size: Annotated[
            int | None,
            typer.Option(
                "--max-batch-size",
                help="The config's max_batch_size.",
                show_default="the default config's",
                rich_help_panel=CONFIG,
            ),
        ] = None,
        max_queue_delay_us: Annotated[
            int | None,
            typer.Option(
                "--max-queue-delay-us",
                help="The config's dynamic batcher delay, microseconds.",
                show_default="the default config's",
                rich_help_panel=CONFIG,
            ),
        ] = None,
        preferred_batch_size: Annotated[
            str | None,
            typer.Option(
                "--preferred-batch-size",
                metavar="<N,...>",
                help="The config's preferred batch sizes, e.g. 8,16.",
                show_default="the default config's",
                rich_help_panel=CONFIG,
            ),
        ] = None,
        instance_count: Annotated[
            int | None,
            typer.Option(
                "--instance-count",
                help="The config's instances (of its instance group).",
                show_default="the default config's",
                rich_help_panel=CONFIG,
            ),
        ] = None,
        profile: Annotated[
            Path | None,
            typer.Option(
                "--profile",
                help="Profile JSON (perfsweep.profile) or simulated-device TOML instead of the "
                "run's statistics.",
                rich_help_panel=PROFILE,
            ),
        ] = None,
        url: Annotated[
            str | None,
            typer.Option(
                "--url",
                metavar="<URL|HOST:PORT>",
                help="The HTTP address of a running server to probe for the profile (a few "
                "hundred requests); its model's current config is the default config.",
                rich_help_panel=PROFILE,
            ),
        ] = None,
        model: Annotated[
            str | None,
            typer.Option(
                "--model", help="The model to probe (with --url).", rich_help_panel=PROFILE
            ),
        ] = None,
        profile_output: Annotated[
            Path | None,
            typer.Option(
                "--profile-output",
                help="Write the profile used as JSON (read it back with --profile).",
                rich_help_panel=PROFILE,
            ),
        ] = None,
        input_data: InputDataFlag = None,
        shape: ShapeFlag = None,
        batch_size: BatchSizeFlag = None,
        as_json: Annotated[
            bool,
            typer.Option("--json", help="Print the answer as JSON.", rich_help_panel=OUTPUT),
        ] = False,
        ssl_ca: SslCaHttpFlag = None,
        ssl_cert: SslCertFlag = None,
        ssl_key: SslKeyFlag = None,
        ssl_insecure: SslInsecureFlag = False,
        header: HeaderFlag = None,
        header_file: HeaderFileFlag = None,
    ) -> None:
        """Predict a config's latency at a rate, or its capacity, from a profile.

        The profile is a run's, a file's, or one probed from a running server with --url: with
        --input-data, --shape and --batch-size it sends the load's request data, as
        `perfsweep run` does.
        """
        from analyzer.config.scenario import load_scenario
        from analyzer.predict.planner import PlanRequest, plan, render_text

        given = load_scenario(
            None,
            {
                **input_overrides(shape, input_data, batch_size),
                **traffic_overrides(arrival, trace, value(trace_unit)),
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
                rate_rps=rate_rps,
                p99_ms=p99_ms,
                max_batch_size=max_batch_size,
                max_queue_delay_us=max_queue_delay_us,
                preferred_batch_size=_sizes(preferred_batch_size),
                instance_count=instance_count,
                seed=seed,
                url=url,
                model=model,
                access=given.model.access().check(),
                inputs=inputs,
                save_profile=profile_output,
                arrival=given.traffic.arrival_process(),
            )
        )
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            Console().print(render_text(report), highlight=False, soft_wrap=True, markup=False)
