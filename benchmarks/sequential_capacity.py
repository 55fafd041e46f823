"""One capacity search, fixed windows vs sequential steps, on the reference server's simulated device.

Both searches run through real Locust (``LocustLoadGenerator.find_capacity``) against one
reference server with one simulated model (``--device-ms`` per execution plus ``--per-item-ms``
per batch item, dynamic batching up to ``--max-batch``, one instance), with the sweep's step
template (``analyzer/evaluation/plan.py``: count windows of ``--min-requests`` lasting at least
``--window-s``, two windows, ``--warmup-s`` per step, failures confirmed once). The sequential
variant sets ``LoadSpec.sequential`` (cap ``--max-requests`` requests or ``--seq-windows``
windows) and so warms up once per search instead of once per step.

For each variant and repeat it prints the capacity found, whether it was at the boundary, the
steps, the requests measured and the wall time, and writes
``benchmarks/results/sequential_capacity-<UTC>.json`` (``format_version`` 1, the environment,
every step).

    .venv/bin/python benchmarks/sequential_capacity.py [--repeats 2] [--p99-ms 50]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.load import EngineOptions, LocustLoadGenerator  # noqa: E402
from analyzer.measure.specs import Arrival, CapacitySpec, Goals, LoadMode, LoadSpec  # noqa: E402
from analyzer.measure.stepping import StepTest  # noqa: E402
from analyzer.rundir.results import environment  # noqa: E402
from tests.load.refserver import RefServer, write_sim_model  # noqa: E402


def _spec(args: argparse.Namespace, sequential: bool) -> CapacitySpec:
    step = LoadSpec(
        LoadMode.REQUEST_RATE,
        1.0,
        arrival=Arrival.POISSON,
        warmup_s=args.warmup_s,
        window_s=args.window_s,
        window_requests=args.min_requests,
        min_window_s=args.window_s,
        stable_windows=2,
        max_windows=2,
    )
    if sequential:
        test = StepTest(goal_ms=args.p99_ms, max_requests=args.max_requests)
        step = replace(step, sequential=test, max_windows=args.seq_windows)
    return CapacitySpec(
        goals=Goals(p99_ms=args.p99_ms),
        start_rps=args.start_rps,
        max_rps=20_000.0,
        resolution=args.resolution,
        step=step,
        confirm_failures=True,
    )


def main() -> None:
    """Run the comparison and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--p99-ms", type=float, default=50.0)
    parser.add_argument("--device-ms", type=float, default=4.0)
    parser.add_argument("--per-item-ms", type=float, default=0.5)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--start-rps", type=float, default=50.0)
    parser.add_argument("--resolution", type=float, default=0.1)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--window-s", type=float, default=4.0)
    parser.add_argument("--min-requests", type=int, default=200)
    parser.add_argument("--max-requests", type=int, default=10_000)
    parser.add_argument("--seq-windows", type=int, default=3)
    args = parser.parse_args()

    repo = Path(tempfile.mkdtemp(prefix="perfsweep-seqcap-"))
    write_sim_model(
        repo,
        "seqcap",
        args.device_ms,
        per_item_ms=args.per_item_ms,
        max_batch_size=args.max_batch,
        dynamic_batching="dynamic_batching { }",
    )
    rows: list[dict[str, Any]] = []
    with RefServer(repo, ("seqcap",)) as srv:
        options = EngineOptions(url=srv.http_url, model="seqcap", metrics_url=srv.metrics_url)
        with LocustLoadGenerator(options) as generator:
            for repeat in range(args.repeats):
                for sequential in (False, True):
                    started = time.monotonic()
                    result = generator.find_capacity(_spec(args, sequential))
                    wall = time.monotonic() - started
                    rows.append(
                        {
                            "variant": "sequential" if sequential else "fixed windows",
                            "repeat": repeat,
                            "capacity_rps": result.capacity_rps,
                            "at_boundary": result.at_boundary,
                            "steps": len(result.points),
                            "requests": sum(p.request_count for p in result.points),
                            "wall_s": round(wall, 1),
                            "points": [
                                {
                                    "target": p.target,
                                    "request_count": p.request_count,
                                    "p99_ms": p.p99_ms,
                                    "valid": p.valid,
                                    "verdict": p.step.verdict.value if p.step else None,
                                    "reason": p.step.reason if p.step else None,
                                }
                                for p in result.points
                            ],
                        }
                    )
                    r = rows[-1]
                    print(
                        f"{r['variant']}: {r['capacity_rps']:.1f} req/s, {r['steps']} steps, "
                        f"{r['requests']} requests, {r['wall_s']} s",
                        file=sys.stderr,
                        flush=True,
                    )
    print(
        f"capacity search at p99 <= {args.p99_ms:g} ms, simulated device {args.device_ms:g} ms "
        f"+ {args.per_item_ms:g} ms/item, max batch {args.max_batch}\n"
    )
    print("| variant | repeat | capacity req/s | at boundary | steps | requests | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['repeat']} | {r['capacity_rps']:.1f} | "
            f"{'yes' if r['at_boundary'] else 'no'} | {r['steps']} | {r['requests']} | "
            f"{r['wall_s']} |"
        )
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "benchmarks" / "results" / f"sequential_capacity-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "format_version": 1,
                "kind": "perfsweep.benchmark.sequential_capacity",
                "environment": environment(scenario_hash=""),
                "args": vars(args),
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
