"""A pipeline tuned as one against its stages tuned one at a time, on a real Triton 2.51.

The pipeline (``tests/support/pipelines.py``): the ensemble ``pipe`` of a cheap preprocess, a
GPU-like model (host work that overlaps across instances, then device work serialised by a lock
every instance shares) and a cheap postprocess, all Python-backend models.

* ``joint``: ``perfsweep run --server triton --model pipe``: every composing model's knobs in one
  search, the load sent to the ensemble, the goal its end-to-end p99.
* ``stagewise``: ``perfsweep run --server triton --model <stage>`` for each composing model alone,
  the same scenario (the same p99 goal, each stage's own load), and the three answers assembled
  (what tuning composing models one by one gives).

Each answer (its ``best/`` tree, or the configs it kept) is dropped into a copy of the repository;
one instrument then measures both: Triton started on the copy and ``perfsweep load
--find-capacity`` on the ensemble at the goal, ``--rounds`` times in the order A B B A ... so
drift of the machine hits both alike. Quality = joint capacity / stagewise capacity (medians);
wall time = the ``perfsweep run`` processes (the stagewise one: its three runs together).

Command (repository root): ``.venv/bin/python benchmarks/pipeline_vs_stagewise.py``
(``--trials 8 --p99-ms 150 --rounds 2 --search tpe --validate-repeats 1``: every sweep's
strategy and validation repeats; ``--device-ms 20 --per-item-ms 4 --edge-ms 2``: the
GPU-like stage's device time and the other two stages' time, chosen so that the pipeline's
capacity, not this machine's load generator, is what is measured). Writes ``benchmarks/results/pipeline_vs_stagewise-*.json``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.rundir.results import load_summary  # noqa: E402
from benchmarks.record import run_recorded  # noqa: E402
from tests.support.pipelines import (  # noqa: E402
    STAGES,
    Comparison,
    compare_joint_and_stagewise,
    make_pipeline_repository,
)
from tests.support.real_triton import TritonInstall  # noqa: E402

FORMAT_VERSION = 2  # 2: knobs and recommended keyed by model for both answers


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    comparison = Comparison(
        p99_ms=args.p99_ms,
        max_rate_rps=args.max_rate_rps,
        max_delay_us=args.max_delay_us,
        trials=args.trials,
        validate_repeats=args.validate_repeats,
        search=args.search,
        rounds=args.rounds,
    )
    repo = make_pipeline_repository(
        work / "models",
        device_ms=args.device_ms,
        per_item_ms=args.per_item_ms,
        edge_ms=args.edge_ms,
    )
    answers = compare_joint_and_stagewise(TritonInstall.locate(), repo, work, comparison)
    joint, stagewise = answers["joint"], answers["stagewise"]
    summaries = {
        "joint": {"pipe": load_summary(joint.runs["pipe"])},
        "stagewise": {s: load_summary(stagewise.runs[s]) for s in STAGES},
    }

    def described(which: str) -> dict[str, Any]:
        answer, runs = answers[which], summaries[which]
        return {
            "capacity_rps": answer.capacity_rps,
            "wall_s": round(answer.wall_s, 1),
            "knobs": {m: r["best"]["config"] for m, r in runs.items()},
            "recommended": {m: r["recommendation"]["config"] for m, r in runs.items()},
        }

    return {
        "p99_ms": args.p99_ms,
        "infer_device_ms": [args.device_ms, args.per_item_ms],
        "edge_ms": args.edge_ms,
        "trials": args.trials,
        "search": args.search,
        "validate_repeats": args.validate_repeats,
        "joint": described("joint"),
        "stagewise": described("stagewise"),
        "capacity_ratio": (
            round(joint.median_rps / stagewise.median_rps, 3) if stagewise.median_rps > 0 else None
        ),
    }


def table(result: dict[str, Any]) -> str:
    rows = [
        "| answer | capacity at the goal (req/s, each measurement) | median | wall time (s) |",
        "|---|---|---|---|",
    ]
    for key in ("joint", "stagewise"):
        r = result[key]
        caps = ", ".join(f"{c:.1f}" for c in r["capacity_rps"])
        rows.append(
            f"| {key} | {caps} | {statistics.median(r['capacity_rps']):.1f} | {r['wall_s']} |"
        )
    rows.append(f"\njoint / stagewise capacity: {result['capacity_ratio']}x")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--p99-ms", type=float, default=150.0)
    parser.add_argument("--max-rate-rps", type=float, default=300.0)
    parser.add_argument("--device-ms", type=float, default=20.0, help="infer: device ms a batch")
    parser.add_argument("--per-item-ms", type=float, default=4.0, help="infer: device ms an item")
    parser.add_argument("--edge-ms", type=float, default=2.0, help="pre and post: ms a batch")
    parser.add_argument("--max-delay-us", type=int, default=16000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--search", default="tpe", help="every sweep's --search strategy")
    parser.add_argument("--validate-repeats", type=int, default=1)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--keep", type=Path, help="copy the work directory here")
    args = parser.parse_args()
    return run_recorded(
        "pipeline_vs_stagewise",
        FORMAT_VERSION,
        lambda work: run(args, work),
        table,
        output=args.output,
        keep=args.keep,
    )


if __name__ == "__main__":
    if re.search(r"\bpytest\b", sys.argv[0]):  # pragma: no cover
        raise SystemExit("run this file directly, not through pytest")
    raise SystemExit(main())
