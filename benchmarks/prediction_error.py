"""Predicted vs measured capacities of a list of configs, the first one the calibration's (the
simulator benchmarks of a pipeline and of a mix)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any


def score(rows: list[dict[str, Any]], predict: Callable[[Any], float]) -> dict[str, Any]:
    """Each row (``sim``: its configs as the simulator takes them; ``measured_rps``) gets its
    ``predicted_rps`` and relative ``error``, its ``sim`` described; the summary counts the rows
    after the first (the one the latency offsets were fitted on is reported, not counted)."""
    errors: list[float] = []
    for i, row in enumerate(rows):
        predicted = predict(row["sim"])
        row["predicted_rps"] = round(predicted, 1)
        measured = row["measured_rps"]
        row["error"] = round(abs(predicted - measured) / measured, 4) if measured > 0 else None
        if i > 0 and row["error"] is not None:
            errors.append(row["error"])
        row["sim"] = {name: c.describe() for name, c in row["sim"].items()}
    return {
        "configs": rows,
        "errors_counted": len(errors),
        "median_error": round(statistics.median(errors), 4) if errors else None,
        "worst_error": round(max(errors), 4) if errors else None,
    }


def table(result: dict[str, Any], fitted: str) -> str:
    """The markdown table of :func:`score`'s result; ``fitted``: what was fitted on the first
    config, for its row and the summary line."""
    rows = ["| config | measured (req/s) | predicted (req/s) | error |", "|---|---|---|---|"]
    for i, r in enumerate(result["configs"]):
        err = "" if r["error"] is None else f"{100 * r['error']:.1f} %"
        mark = " (offsets fitted here)" if i == 0 else ""
        rows.append(
            f"| {r['config']}{mark} | {r['measured_rps']:.1f} | {r['predicted_rps']:.1f} | {err} |"
        )
    rows.append(
        f"\nprediction error over {result['errors_counted']} configs: median "
        f"{100 * (result['median_error'] or 0):.1f} %, worst {100 * (result['worst_error'] or 0):.1f} %"
        f" ({fitted}, probe {result['probe_s']} s)"
    )
    return "\n".join(rows)
