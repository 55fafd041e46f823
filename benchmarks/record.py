"""One benchmark run, recorded: a work directory for it, the environment and the machine's load
around it, the result as markdown on the console and as JSON in ``benchmarks/results/``."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analyzer.rundir.results import environment

RESULTS = Path(__file__).resolve().parent / "results"


def run_recorded(
    name: str,
    format_version: int,
    run: Callable[[Path], dict[str, Any]],
    table: Callable[[dict[str, Any]], str],
    *,
    output: Path | None = None,
    keep: Path | None = None,
) -> int:
    """``run(work)`` in a fresh work directory (removed after; copied to ``keep`` first when
    given), its ``table`` printed and its result written to ``output`` (default
    ``benchmarks/results/<name>-<UTC>.json``) as ``perfsweep.benchmark.<name>``."""
    work = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    try:
        started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        load_before = os.getloadavg()
        result = run(work)
        doc = {
            "format_version": format_version,
            "kind": f"perfsweep.benchmark.{name}",
            "started_at": started,
            "environment": environment(name),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "result": result,
        }
        print(table(result))
        out = output or RESULTS / f"{name}-{started}.json"
        out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"wrote {out}")
    finally:
        if keep:
            shutil.copytree(work, keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0
