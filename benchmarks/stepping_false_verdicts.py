"""False-verdict rate of the sequential step rule (``analyzer/measure/stepping.py``) on planted latencies.

Each planted process has a known (or very precisely simulated) p99; the goal is put exactly at
it, so the honest answer of every step is BOUNDARY and every PASS or FAIL is a verdict the data
cannot support. The rule promises each at most ``1 - confidence`` of the time over all its looks.
The same looks and levels on the same windows with requests counted as independent draws (the
naive binomial rule, ``tau = 1``) are shown next to it. A second table gives the requests a step
needs far from the boundary (true share over the goal 0.01 % and 10 %). The column "FAIL far"
counts the false FAILs the test decided far beyond the goal (``StepRecord.far_beyond``): the
ones a capacity search takes without a repeat.

Processes: independent lognormal; lognormal of a Gaussian AR(1) with lag-one correlation 0.5
and 0.9; the sojourn time of an M/D/1 queue at load 0.8 (Lindley's recursion, vectorised; its p99
from one seeded run of 4 M customers).

It prints two markdown tables and writes ``benchmarks/results/stepping_false_verdicts-<UTC>.json``
(``format_version`` 1, the environment, every cell).

    .venv/bin/python benchmarks/stepping_false_verdicts.py [--reps 400] [--cap 5000] [--window 500]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import NormalDist

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.measure.stepping import SequentialRule, StepRecord, StepVerdict, decide_windows  # noqa: E402
from analyzer.rundir.results import environment  # noqa: E402

Sampler = Callable[[np.random.Generator, int, int], np.ndarray]


def ar1(phi: float) -> Sampler:
    def sample(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
        z = np.empty((rows, n))
        z[:, 0] = rng.standard_normal(rows)
        noise = rng.standard_normal((rows, n)) * math.sqrt(1.0 - phi * phi)
        for t in range(1, n):
            z[:, t] = phi * z[:, t - 1] + noise[:, t]
        return 20.0 * np.exp(0.5 * z)

    return sample


def ar1_quantile(q: float) -> float:
    return 20.0 * math.exp(0.5 * NormalDist().inv_cdf(q))


def md1(load: float, service_ms: float = 10.0, burn_in: int = 5_000) -> Sampler:
    """Sojourn times of an M/D/1 queue: W_n = S_n - min_{j<=n} S_j with S the walk of D - A."""

    def sample(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
        gaps = rng.exponential(service_ms / load, (rows, burn_in + n))
        walk = np.cumsum(service_ms - gaps, axis=1)
        walk = np.concatenate([np.zeros((rows, 1)), walk[:, :-1]], axis=1)
        wait = walk - np.minimum(np.minimum.accumulate(walk, axis=1), 0.0)
        return (wait + service_ms)[:, burn_in:]

    return sample


def run(test_goal: float, data: np.ndarray, cap: int, window: int) -> tuple[StepRecord, StepRecord]:
    rule = SequentialRule(test_goal, max_requests=cap)
    record: StepRecord | None = None
    for start in range(0, cap, window):
        record = rule.update(data[start : start + window])
        if record.verdict.final:
            break
    over: list[int] = []
    ns: list[int] = []
    naive: StepRecord | None = None
    for start in range(0, cap, window):
        chunk = data[start : start + window]
        over.append(int((chunk > test_goal).sum()))
        ns.append(chunk.size)
        naive = decide_windows(rule.test, over, ns, tau=1.0)
        if naive.verdict.final:
            break
    assert record is not None and naive is not None
    return record, naive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--cap", type=int, default=5_000, help="max_requests of a step")
    parser.add_argument("--window", type=int, default=500, help="requests per window")
    parser.add_argument("--far-cap", type=int, default=20_000, help="max_requests, far steps")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    t0 = time.monotonic()

    rng = np.random.default_rng(20261201)
    md1_sampler = md1(0.8)
    md1_long = md1_sampler(np.random.default_rng(1), 1, 4_000_000)[0]
    processes: list[tuple[str, Sampler, Callable[[float], float]]] = [
        ("independent lognormal", ar1(0.0), ar1_quantile),
        ("AR(1) phi 0.5", ar1(0.5), ar1_quantile),
        ("AR(1) phi 0.9", ar1(0.9), ar1_quantile),
        ("M/D/1 load 0.8", md1_sampler, lambda q: float(np.quantile(md1_long, q))),
    ]
    alpha = 0.05
    rows = []
    for name, sampler, quantile in processes:
        goal = quantile(0.99)
        data = sampler(rng, args.reps, args.cap)
        counts = {"rule": dict.fromkeys(StepVerdict, 0), "naive": dict.fromkeys(StepVerdict, 0)}
        n_sum = {"rule": 0, "naive": 0}
        far = {"rule": 0, "naive": 0}
        taus = []
        for row in data:
            rule, naive = run(goal, row, args.cap, args.window)
            far["rule"] += rule.far_beyond
            far["naive"] += naive.far_beyond
            counts["rule"][rule.verdict] += 1
            counts["naive"][naive.verdict] += 1
            n_sum["rule"] += rule.n
            n_sum["naive"] += naive.n
            taus.append(rule.tau)
        for which in ("rule", "naive"):
            rows.append(
                {
                    "process": name,
                    "rule": "sequential (n_eff)" if which == "rule" else "naive binomial",
                    "goal_ms": goal,
                    "pass": counts[which][StepVerdict.PASS] / args.reps,
                    "fail": counts[which][StepVerdict.FAIL] / args.reps,
                    "fail_far": far[which] / args.reps,
                    "boundary": counts[which][StepVerdict.BOUNDARY] / args.reps,
                    "mean_n": n_sum[which] / args.reps,
                    "median_tau": float(np.median(taus)) if which == "rule" else 1.0,
                }
            )
    far_rows = []
    far_reps = max(10, args.reps // 20)
    for name, sampler, quantile in processes:
        for true_q, expect in ((0.9999, StepVerdict.PASS), (0.9, StepVerdict.FAIL)):
            goal = quantile(true_q)
            data = sampler(rng, far_reps, args.far_cap)
            records = [run(goal, row, args.far_cap, args.window)[0] for row in data]
            far_rows.append(
                {
                    "process": name,
                    "true_share_over": 1 - true_q,
                    "right": sum(r.verdict is expect for r in records) / far_reps,
                    "median_n": float(np.median([r.n for r in records])),
                    "max_n": max(r.n for r in records),
                }
            )

    tol = 3 * math.sqrt(alpha * (1 - alpha) / args.reps)
    print(
        f"stepping false verdicts: goal at the true p99, confidence 95 %, {args.reps} steps per "
        f"process, windows of {args.window}, cap {args.cap} "
        f"(Monte-Carlo tolerance 3 SE = {tol:.1%}; {time.monotonic() - t0:.0f} s)\n"
    )
    print(
        "| process | rule | PASS (false) | FAIL (false) | FAIL far | BOUNDARY | mean n | "
        "median tau |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['process']} | {r['rule']} | {r['pass']:.1%} | {r['fail']:.1%} | "
            f"{r['fail_far']:.1%} | {r['boundary']:.1%} | {r['mean_n']:.0f} | "
            f"{r['median_tau']:.1f} |"
        )
    print(f"\nfar from the boundary ({far_reps} steps each, cap {args.far_cap}):\n")
    print("| process | true share over | right verdict | median n | max n |")
    print("|---|---|---|---|---|")
    for r in far_rows:
        print(
            f"| {r['process']} | {r['true_share_over']:.2%} | {r['right']:.0%} | "
            f"{r['median_n']:.0f} | {r['max_n']} |"
        )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    output = (
        args.output or ROOT / "benchmarks" / "results" / f"stepping_false_verdicts-{stamp}.json"
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format_version": 1,
        "kind": "perfsweep.benchmark.stepping_false_verdicts",
        "environment": environment(scenario_hash=""),
        "reps": args.reps,
        "cap": args.cap,
        "window": args.window,
        "boundary": rows,
        "far": far_rows,
    }
    output.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
