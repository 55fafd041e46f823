"""``perfsweep report``: re-render a run directory's report.html, or compare two runs.

Exit codes: 0 written, 2 the run directory is missing, damaged or of another format version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from analyzer.commands.help import epilog
from analyzer.commands.names import command_class

EXAMPLES = epilog(
    [
        ("perfsweep report reports/run-1", "render RUN_DIR/report.html again"),
        (
            "perfsweep report reports/run-2 --compare reports/run-1",
            "both runs side by side, differences called out",
        ),
        ("perfsweep report reports/run-1 -o /tmp/run-1.html", "written elsewhere"),
    ],
    "Exit status: 0 written, 2 the run directory is missing, damaged or of another format version.",
)


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to ``app``."""

    @app.command("report", cls=command_class("report"), epilog=EXAMPLES)
    def report(
        run_dir: Annotated[Path, typer.Argument(help="Run directory written by `perfsweep run`.")],
        compare: Annotated[
            Path | None,
            typer.Option(
                "--compare",
                help="Another run directory: render both side by side, differences called out.",
            ),
        ] = None,
        output: Annotated[
            Path | None,
            typer.Option(
                "--output",
                "-o",
                help="HTML file to write (default: RUN_DIR/report.html, or "
                "RUN_DIR/compare-<other>.html with --compare).",
            ),
        ] = None,
        min_gpu_utilization: Annotated[
            float | None,
            typer.Option(
                "--min-gpu-utilization",
                help="Flag configs whose GPU utilisation at their operating point is below this "
                "percentage (trials table and verdict), as Model Analyzer's flag does.",
            ),
        ] = None,
    ) -> None:
        """Render the self-contained HTML report of a sweep (opens offline)."""
        from analyzer.report import write_compare_report, write_report

        if compare is not None:
            path = write_compare_report(run_dir, compare, output)
        else:
            path = write_report(run_dir, output, min_gpu_utilization_pct=min_gpu_utilization)
        Console().print(f"report written: {path}", highlight=False, soft_wrap=True)
