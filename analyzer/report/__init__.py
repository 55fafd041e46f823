"""The HTML report: run directory -> report record -> matplotlib figures -> one HTML file.

::

    run = load_run(run_dir)          # read the run directory     (analyzer.report.rundir)
    record = build_record(run)       # the typed record, pure      (analyzer.report.build, .record)
    html = render_report(record)     # figures + jinja2           (analyzer.report.render)

:func:`write_report` does both and writes ``report.html`` into the run directory; the sweep calls
it when a run ends, and ``perfsweep report RUN_DIR`` re-renders. ``--compare`` renders two runs
side by side (:mod:`analyzer.report.compare`).

Layer 9 of ``analyzer`` (``docs/internals.md``), with ``gate``: imports ``search`` and
``predict`` and the layers below them.
"""

from __future__ import annotations

from pathlib import Path

from analyzer.report.build import build_record
from analyzer.report.record import ReportRecord
from analyzer.report.rundir import RunData, load_run
from analyzer.rundir.results import write_atomic

__all__ = [
    "ReportRecord",
    "RunData",
    "build_record",
    "load_run",
    "write_compare_report",
    "write_report",
]


def write_report(
    run_dir: Path, output: Path | None = None, *, min_gpu_utilization_pct: float | None = None
) -> Path:
    """Render the report of a run directory.

    Args:
        run_dir: A directory written by ``perfsweep run``.
        output: Where to write; default ``<run_dir>/report.html``.
        min_gpu_utilization_pct: Flag configs whose GPU utilisation at their operating point
            is below this (Model Analyzer's ``--min-gpu-utilization``); None: no flag.

    Returns:
        The path written.

    Raises:
        ResultFormatError: The run directory's files are missing, damaged or of another version.
    """
    from analyzer.report.render import render_report

    record = build_record(load_run(Path(run_dir)), min_gpu_utilization_pct=min_gpu_utilization_pct)
    path = Path(output) if output is not None else Path(run_dir) / "report.html"
    write_atomic(path, render_report(record))
    return path


def write_compare_report(run_dir: Path, other_dir: Path, output: Path | None = None) -> Path:
    """Render two runs side by side, differences called out (``perfsweep report --compare``).

    Args:
        run_dir: The run the comparison is about ("A", e.g. after a change).
        other_dir: The run to compare against ("B", e.g. before).
        output: Where to write; default ``<run_dir>/compare-<other run id>.html``.

    Returns:
        The path written.
    """
    from analyzer.report.compare import build_comparison, render_comparison

    a = build_record(load_run(Path(run_dir)))
    b = build_record(load_run(Path(other_dir)))
    comparison = build_comparison(a, b)
    if output is None:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in Path(other_dir).name)
        output = Path(run_dir) / f"compare-{safe}.html"
    write_atomic(Path(output), render_comparison(comparison, a, b))
    return Path(output)
