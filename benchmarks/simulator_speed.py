"""Speed of the predictor over a whole search space: configs per second, before vs after.

"Before" is ``analyzer/predict/simulator.py`` as of commit :data:`BEFORE_COMMIT` (read with
``git show`` and loaded as a module of its own): one :func:`capacity` bisection per config.
"After" is this checkout's :func:`analyzer.predict.capacity.capacities` over the same configs
(warm-started brackets, equivalent configs simulated once, the leaner event loop; in
``--workers`` processes, one instance count each). Both use
the same profile, goal, seed and requests per simulated rate, in one process, one after the
other.

Space: the default scenario's ``[space]`` (max batch size 1-32, eight delays 0-10 ms,
preferred depth 0-2, 1-4 instances: 480 distinct configs), on the simulated ResNet-50
profile (``resnet50_sim``, jitter 3 %), goal p99 <= 60 ms.

What it compares besides the time: each config's capacity after vs before (relative
difference), and, as the yardstick of simulation noise, before's capacity with seed 0 vs
seed 1 (``--noise``; doubles the "before" time).

It prints a markdown table and writes ``benchmarks/results/simulator_speed-<UTC>.json``
(``format_version`` 1, the environment, every config's capacities).

    .venv/bin/python benchmarks/simulator_speed.py [--limit N] [--noise] [--p99-ms 60]
        [--workers 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.config.sections import SpaceSection  # noqa: E402
from analyzer.predict.capacity import capacities  # noqa: E402
from analyzer.predict.sim_records import SimConfig  # noqa: E402
from analyzer.predict.sources import from_toml  # noqa: E402
from analyzer.rundir.results import environment  # noqa: E402
from analyzer.search.space import SearchSpace  # noqa: E402

#: The last commit with the original simulator (one bisection per config, closures).
BEFORE_COMMIT = "31938d8"


def load_before() -> ModuleType:
    """The simulator module as it was at :data:`BEFORE_COMMIT`."""
    source = subprocess.run(
        ["git", "show", f"{BEFORE_COMMIT}:analyzer/predict/simulator.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    spec = importlib.util.spec_from_loader("simulator_before", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{BEFORE_COMMIT}:simulator.py", "exec"), module.__dict__)
    return module


def space_configs() -> list[SimConfig]:
    """Every distinct config of the default scenario's search space."""
    bounds = SpaceSection()
    space = SearchSpace.from_bounds(
        bounds.max_batch_size,
        bounds.max_queue_delay_us,
        bounds.delay_steps,
        bounds.preferred_batch_size,
        bounds.instance_count,
    )
    dims = space.param_bounds()
    knobs = {
        space.decode(dict(zip(dims, values, strict=True)))
        for values in itertools.product(*(range(lo, hi + 1) for lo, hi in dims.values()))
    }
    return sorted(
        {SimConfig.from_knobs(k) for k in knobs},
        key=lambda c: (
            c.instance_count,
            c.max_batch_size,
            c.preferred_batch_size,
            c.max_queue_delay_us,
        ),
    )


def rel(a: float, b: float) -> float:
    return abs(a - b) / b if b > 0 else (0.0 if a == 0 else float("inf"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=0, help="Only every k-th config, N of them.")
    parser.add_argument("--noise", action="store_true", help="Also run before with seed 1.")
    parser.add_argument("--p99-ms", type=float, default=60.0)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=1, help="Processes for after.")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)

    profile = from_toml("resnet50_sim")
    configs = space_configs()
    if args.limit and args.limit < len(configs):
        step = len(configs) // args.limit
        configs = configs[::step][: args.limit]
    before = load_before()

    def run_before(seed: int) -> tuple[float, dict[SimConfig, float], int]:
        caps: dict[SimConfig, float] = {}
        rates = 0
        start = time.perf_counter()
        for c in configs:
            old_config = before.SimConfig(
                c.max_batch_size,
                c.max_queue_delay_us,
                c.preferred_batch_size,
                c.instance_count,
                c.dynamic_batching,
            )
            cap = before.capacity(
                profile, old_config, args.p99_ms, requests=args.requests, seed=seed
            )
            caps[c] = cap.capacity_rps
            rates += len(cap.steps)
        return time.perf_counter() - start, caps, rates

    t_before, caps_before, rates_before = run_before(0)
    start = time.perf_counter()
    after = capacities(
        profile, configs, args.p99_ms, requests=args.requests, seed=0, workers=args.workers
    )
    t_after = time.perf_counter() - start
    caps_after = {c: p.capacity_rps for c, p in after.items()}
    rates_after = len({id(p) for p in after.values()})  # searches run (equivalents share one)
    sims_after = sum(len(p.steps) for p in {id(p): p for p in after.values()}.values())
    diffs = [rel(caps_after[c], caps_before[c]) for c in configs]
    noise: list[float] = []
    caps_seed1: dict[SimConfig, float] = {}
    if args.noise:
        _, caps_seed1, _ = run_before(1)
        noise = [rel(caps_seed1[c], caps_before[c]) for c in configs]

    n = len(configs)
    print(f"{n} configs, resnet50_sim, p99 <= {args.p99_ms:g} ms, {args.requests} arrivals/rate\n")
    print("| | wall (s) | configs/s | simulated rates | searches |")
    print("|---|---|---|---|---|")
    print(
        f"| before ({BEFORE_COMMIT}) | {t_before:.1f} | {n / t_before:.1f} | {rates_before} | {n} |"
    )
    print(
        f"| after (workers {args.workers}) | {t_after:.1f} | {n / t_after:.1f} | {sims_after} | {rates_after} |"
    )
    print(f"\nspeed-up: {t_before / t_after:.1f}x")

    def summary(values: list[float]) -> str:
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        return (
            f"median {statistics.median(ordered):.1%}, p90 {p90:.1%}, max {ordered[-1]:.1%}, "
            f"over 5 %: {sum(v > 0.05 for v in ordered)}"
        )

    print(f"capacity after vs before (seed 0): {summary(diffs)}")
    if noise:
        print(f"simulation noise, before seed 1 vs seed 0: {summary(noise)}")

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    output = args.output or ROOT / "benchmarks" / "results" / f"simulator_speed-{stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = [
        {
            "config": c.describe(),
            "before_rps": caps_before[c],
            "after_rps": caps_after[c],
            **({"before_seed1_rps": caps_seed1[c]} if caps_seed1 else {}),
        }
        for c in configs
    ]
    doc = {
        "format_version": 1,
        "kind": "perfsweep.benchmark.simulator_speed",
        "environment": environment(scenario_hash=""),
        "before_commit": BEFORE_COMMIT,
        "p99_ms": args.p99_ms,
        "requests": args.requests,
        "workers": args.workers,
        "configs": n,
        "before_s": t_before,
        "after_s": t_after,
        "speedup": t_before / t_after,
        "rows": rows,
    }
    output.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
