"""Search efficiency on planted landscapes: how many trials until 95 % / 99 % of the optimum?

The landscapes are the planted capacity models of ``tests/sweep/planted.py`` (a queueing
approximation of a dynamic batcher on a simulated accelerator), on a grid of 672 configs
(max_batch_size 1-64 x 8 queue delays x 3 preferred-size depths x 1-4 instances). The optimum of
each landscape is found by brute force over the whole grid; then each method searches it:

* ``perfsweep``: the real sweep (``analyzer.sweep.loop.run_sweep``) with the fake Target and
  LoadGenerator seams answering from the formula: seeds, TPE, constraints, exactly as shipped.
* ``random``: Optuna's RandomSampler over the same encoding, no seeds.
* ``ma-quick``: Model Analyzer's quick search as documented (hill climbing over max_batch_size
  and instance count only, from the smallest config, radius-3 neighbourhood, 3 measured
  neighbours per step, steps quantised at 0.09/0.3/1.0, default dynamic batching, i.e. no
  queue delay and no preferred sizes).

"Trials to X %" counts measured configs (the baseline is not counted for anyone) until the best
*true* capacity found reaches X % of the grid optimum; a method that never gets there within the
budget counts as ``budget + 1``. Medians are over seeds (perfsweep and random) and landscapes.

Usage::

    .venv/bin/python benchmarks/search_efficiency.py [--seeds 10] [--budget 30] [--output FILE]

It prints a markdown table and writes ``benchmarks/results/search_efficiency-<UTC>.json``
(``format_version`` 1, the environment, every run's numbers).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.config.knobs import Knobs  # noqa: E402
from analyzer.config.scenario import Scenario, load_scenario  # noqa: E402
from analyzer.rundir.results import environment, load_trial_record  # noqa: E402
from analyzer.search.space import SearchSpace  # noqa: E402
from analyzer.search.study import Search, TrialOutcome  # noqa: E402
from analyzer.sweep.loop import run_sweep, space_for  # noqa: E402
from tests.sweep.planted import FakeLoadGenerator, FakeTarget, PlantedModel, brute_force  # noqa: E402

#: (name, model, p99 goal ms): a GPU-like device at two goals and a CPU-like device.
LANDSCAPES: list[tuple[str, PlantedModel, float]] = [
    ("gpu-like, p99 20 ms", PlantedModel(), 20.0),
    ("gpu-like, p99 40 ms", PlantedModel(), 40.0),
    (
        "cpu-like, p99 15 ms",
        PlantedModel(
            base_ms=1.0, per_item_ms=2.0, superlinear_ms=0.03, host_item_ms=0.3, contention=0.35
        ),
        15.0,
    ),
    (
        "cpu-like, p99 30 ms",
        PlantedModel(
            base_ms=1.0, per_item_ms=2.0, superlinear_ms=0.03, host_item_ms=0.3, contention=0.35
        ),
        30.0,
    ),
]


def scenario(goal_ms: float, budget: int, seed: int, out: Path) -> Scenario:
    return load_scenario(
        None,
        {
            "goals.p99_ms": goal_ms,
            "space.max_batch_size": [1, 64],
            "space.instance_count": [1, 4],
            "space.max_queue_delay_us": [0, 10000],
            "space.delay_steps": 8,
            "traffic.min_rate_rps": 5.0,
            "traffic.max_rate_rps": 20000.0,
            "budget.capacity_resolution": 0.05,
            "budget.trials": budget,
            "budget.patience": budget + 1,
            "budget.validate_top": 0,
            "run.seed": seed,
            "run.output_dir": str(out),
        },
        env={},
    )


def trace_perfsweep(
    model: PlantedModel, goal: float, budget: int, seed: int, table: dict[Knobs, float]
) -> list[float]:
    """True capacities of the configs the shipped sweep measured, in trial order."""
    with tempfile.TemporaryDirectory() as out:
        s = scenario(goal, budget, seed, Path(out))
        target = FakeTarget()
        summary = run_sweep(
            s, target=target, load=FakeLoadGenerator(target, model, noise=0.0, seed=seed)
        )
        records = sorted(
            (load_trial_record(p) for p in summary.run_dir.glob("trials/*/measurement.json")),
            key=lambda r: r["number"],
        )
        return [table[Knobs.from_dict(r["config"])] for r in records]


def trace_random(
    space: SearchSpace, budget: int, seed: int, table: dict[Knobs, float]
) -> list[float]:
    with tempfile.TemporaryDirectory() as out:
        search = Search(
            space, ["maximize"], str(Path(out) / "j"), "random", sampler="random", seed=seed
        )
        trace = []
        for _ in range(budget):
            asked = search.ask()
            value = table[asked.knobs]
            search.tell(
                asked.number,
                TrialOutcome((value,), {"throughput_slack": -1.0 if value > 0 else 1.0}),
            )
            trace.append(value)
        return trace


def trace_ma_quick(space: SearchSpace, budget: int, table: dict[Knobs, float]) -> list[float]:
    """Model Analyzer's quick search (hill climbing over max_batch_size x instances)."""
    lo, hi = space.log2_mbs
    ilo, ihi = space.instances

    def knobs(c: tuple[int, int]) -> Knobs:
        return Knobs(max_batch_size=2 ** c[0], instance_count=c[1])  # dynamic_batching {} defaults

    measured: dict[tuple[int, int], float] = {}
    trace: list[float] = []

    def measure(c: tuple[int, int]) -> float:
        if c not in measured:
            measured[c] = table.get(knobs(c), 0.0)
            trace.append(measured[c])
        return measured[c]

    def inside(c: tuple[int, int]) -> bool:
        return lo <= c[0] <= hi and ilo <= c[1] <= ihi

    home = (lo, ilo)
    visits: dict[tuple[int, int], int] = {}
    while len(trace) < budget:
        visits[home] = visits.get(home, 0) + 1
        if visits[home] > 1:
            break  # a coordinate visited twice as home: done
        v_home = measure(home)
        neighbours = sorted(
            (
                c
                for c in (
                    (home[0] + dx, home[1] + dy) for dx in range(-3, 4) for dy in range(-3, 4)
                )
                if c != home and inside(c) and math.dist(c, home) <= 3
            ),
            key=lambda c: (math.dist(c, home), c),
        )
        for c in neighbours[:3]:  # MIN_INITIALIZED = 3 measured neighbours
            measure(c)
        direction = [0.0, 0.0]
        used = [c for c in neighbours if c in measured]
        for c in used:
            mean = (measured[c] + v_home) / 2 or 1.0
            weight = (measured[c] - v_home) / mean
            direction[0] += weight * (c[0] - home[0]) / len(used)
            direction[1] += weight * (c[1] - home[1]) / len(used)
        step = [
            int(sum(abs(d) > t for t in (0.09, 0.3, 1.0))) * (1 if d > 0 else -1) for d in direction
        ]
        new = (min(max(home[0] + step[0], lo), hi), min(max(home[1] + step[1], ilo), ihi))
        if new == home:
            break
        if measure(new) < max(measured.values()):
            # Step back ("slow mode"): return to the best point and stop after its neighbours.
            best = max(measured, key=lambda c: measured[c])
            for c in (
                (best[0] + dx, best[1] + dy) for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1))
            ):
                if inside(c) and len(trace) < budget:
                    measure(c)
            break
        home = new
    return trace[:budget]


def trials_to(trace: list[float], optimum: float, fraction: float, budget: int) -> int:
    best = 0.0
    for i, value in enumerate(trace, start=1):
        best = max(best, value)
        if best >= fraction * optimum:
            return i
    return budget + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="JSON result file (default benchmarks/results/search_efficiency-<UTC>.json)",
    )
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    rows = []
    methods: dict[str, Callable[..., list[float]]] = {}
    for name, model, goal in LANDSCAPES:
        space = space_for(scenario(goal, args.budget, 0, Path(".")))
        best, optimum, table = brute_force(model, space, goal)
        methods = {
            "perfsweep": lambda s, m=model, g=goal, t=table: trace_perfsweep(
                m, g, args.budget, s, t
            ),
            "random": lambda s, sp=space, t=table: trace_random(sp, args.budget, s, t),
            "ma-quick": lambda s, sp=space, t=table: trace_ma_quick(sp, args.budget, t),
        }
        for method, run in methods.items():
            seeds = range(args.seeds) if method != "ma-quick" else range(1)  # deterministic
            for seed in seeds:
                trace = run(seed)
                rows.append(
                    {
                        "landscape": name,
                        "optimum_rps": optimum,
                        "optimum": best.to_dict(),
                        "space_size": space.size(),
                        "method": method,
                        "seed": seed,
                        "to95": trials_to(trace, optimum, 0.95, args.budget),
                        "to99": trials_to(trace, optimum, 0.99, args.budget),
                        "best_at_15": max(trace[:15], default=0.0) / optimum,
                        "best_at_budget": max(trace, default=0.0) / optimum,
                        "trials": len(trace),
                    }
                )
    print(
        f"search efficiency: {len(LANDSCAPES)} planted landscapes x {rows[0]['space_size']} configs, "
        f"budget {args.budget} trials, {args.seeds} seeds ({time.monotonic() - t0:.0f} s)\n"
    )
    print(
        "| method | median trials to 95 % | median trials to 99 % | runs reaching 95 % in <= 15 | median best after 15 trials |"
    )
    print("|---|---|---|---|---|")
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        within = sum(r["to95"] <= 15 for r in mine)
        print(
            f"| {method} | {_fmt(statistics.median(r['to95'] for r in mine), args.budget)} | "
            f"{_fmt(statistics.median(r['to99'] for r in mine), args.budget)} | {within}/{len(mine)} | "
            f"{statistics.median(r['best_at_15'] for r in mine):.1%} |"
        )
    print("\nper landscape (median trials to 95 %):")
    for name, _, _ in LANDSCAPES:
        cells = []
        for method in methods:
            mine = [r["to95"] for r in rows if r["method"] == method and r["landscape"] == name]
            cells.append(f"{method} {_fmt(statistics.median(mine), args.budget)}")
        optimum = next(r for r in rows if r["landscape"] == name)
        print(
            f"  {name}: optimum {Knobs.from_dict(optimum['optimum']).label()} "
            f"{optimum['optimum_rps']:.0f} req/s; " + ", ".join(cells)
        )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    output = args.output or ROOT / "benchmarks" / "results" / f"search_efficiency-{stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format_version": 1,
        "kind": "perfsweep.benchmark.search_efficiency",
        "environment": environment(scenario_hash=""),
        "budget": args.budget,
        "seeds": args.seeds,
        "landscapes": [name for name, _, _ in LANDSCAPES],
        "rows": rows,
    }
    output.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {output}")
    return 0


def _fmt(value: float, budget: int) -> str:
    return f"> {budget}" if value > budget else f"{value:g}"


if __name__ == "__main__":
    sys.exit(main())
