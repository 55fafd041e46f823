"""``perfsweep predict``: what a config would do at a rate, or its capacity, without a server.

Exit codes: 0 answered, 2 bad flags, no usable profile, or a config that needs batch sizes
beyond the profiled ones (predictions never extrapolate).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

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
        seed: Annotated[int, typer.Option("--seed", help="Simulation seed.")] = 0,
        as_json: Annotated[bool, typer.Option("--json", help="Print the answer as JSON.")] = False,
    ) -> None:
        """Predict a config's latency at a rate, or its capacity, from a run's profile."""
        from analyzer.predict.planner import PlanRequest, plan, render_text

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
            )
        )
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            Console().print(render_text(report), highlight=False, soft_wrap=True, markup=False)
