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

Claim: the pipeline tuned as one serves at least what its stages tuned one at a time serve, as
the one instrument can tell: its capacity search brackets each capacity within its resolution,
so two trees closer than that measure alike or a step apart. The JSON's ``claims`` say whether
``joint_median >= stagewise_median * (1 - resolution)`` held, and whether every measurement
found a capacity above 0; ``search_strategy`` of each run says which search ran (``predict``
may fall back to tpe, its summary's ``search_note`` says why).

Command (repository root): ``.venv/bin/python benchmarks/pipeline_vs_stagewise.py``
(``--trials 8 --p99-ms 150 --rounds 2 --search tpe --validate-repeats 1``: every sweep's
strategy and validation repeats; ``--device-ms 20 --per-item-ms 4 --edge-ms 2``: the
GPU-like stage's device time and the other two stages' time, chosen so that the pipeline's
capacity, not this machine's load generator, is what is measured; ``--resolution 0.05``: the
instrument's step). The predict search's comparison, in about 10 minutes: ``--search predict
--trials 2 --validate-repeats 2 --rounds 1``. Writes
``benchmarks/results/pipeline_vs_stagewise-*.json``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.rundir.results import load_summary  # noqa: E402
from analyzer.target.triton import managed_triton  # noqa: E402
from benchmarks.record import run_recorded  # noqa: E402
from tests.support.pipelines import STAGES, make_pipeline_repository  # noqa: E402
from tests.support.real_triton import TritonInstall  # noqa: E402
from tests.support.sweeps import assemble, found, load, sweep  # noqa: E402

#: 2: knobs and recommended keyed by model for both answers; 3: ``resolution``, each run's
#: ``search_strategy`` and the ``claims``.
FORMAT_VERSION = 3

#: The scenario of every sweep of :func:`compare_joint_and_stagewise` (the joint one and each
#: stage's alone): the same goal, space and budget.
COMPARISON_SCENARIO = """
objective = "throughput"
[traffic]
min_rate_rps = 5.0
start_rps = 40.0
max_rate_rps = {max_rate_rps}
[goals]
p99_ms = {p99_ms}
max_error_rate = 0.01
[space]
max_batch_size = [4, 16]
max_queue_delay_us = [0, {max_delay_us}]
delay_steps = 4
instance_count = [1, 2]
[budget]
trials = {trials}
patience = {trials}
warmup_s = 0.5
window_s = 1.0
min_requests = 100
capacity_resolution = 0.1
validate_top = 1
validate_repeats = {validate_repeats}
validate_window_factor = 1.0
validation = "{validation}"
[search]
strategy = "{search}"
"""


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare_joint_and_stagewise` sets up and measures."""

    p99_ms: float = 150.0
    max_rate_rps: float = 300.0
    max_delay_us: int = 16000
    trials: int = 8
    validate_repeats: int = 1
    search: str = "tpe"
    #: Capacity measurements of each answer, in the order A B B A ...
    rounds: int = 2
    #: The capacity search's resolution when each answer's tree is measured.
    resolution: float = 0.05

    def scenario(self) -> str:
        return COMPARISON_SCENARIO.format(
            max_rate_rps=self.max_rate_rps,
            p99_ms=self.p99_ms,
            max_delay_us=self.max_delay_us,
            trials=self.trials,
            validate_repeats=self.validate_repeats,
            # One repeat: the winner checked once at its capacity; more: the winner and the
            # baseline each measured that many times (a gain interval from repeats).
            validation="check" if self.validate_repeats == 1 else "repeats",
            search=self.search,
        )


@dataclass
class Answer:
    """One answer (the joint sweep's, or the stages' assembled): its run directories, the
    ``perfsweep run`` wall time, its repository tree and each capacity measured on it."""

    runs: dict[str, Path]
    wall_s: float
    tree: Path
    capacity_rps: list[float] = field(default_factory=list)

    @property
    def median_rps(self) -> float:
        return statistics.median(self.capacity_rps)


def triton_flags(install: TritonInstall) -> tuple[str, ...]:
    """``perfsweep run``'s flags for a managed Triton of ``install``."""
    return ("--server", "triton", "--triton-server-path", str(install.server_bin))


def ensemble_capacity(
    install: TritonInstall, repo: Path, work: Path, comparison: Comparison
) -> float:
    """The ensemble's capacity at the goal: Triton started on ``repo``, ``perfsweep load
    --find-capacity`` on ``pipe``."""
    triton = managed_triton("pipe", repo, work, install.server_bin, 180.0)
    triton.start()
    try:
        doc = load(
            triton.url,
            work / "capacity.json",
            *("--model", "pipe", "--find-capacity", "--p99-ms", str(comparison.p99_ms)),
            *("--max-rps", str(comparison.max_rate_rps)),
            *("--resolution", str(comparison.resolution)),
        )
        return float(doc["capacity_rps"])
    finally:
        triton.stop()


def compare_joint_and_stagewise(
    install: TritonInstall, repo: Path, work: Path, comparison: Comparison
) -> dict[str, Answer]:
    """The pipeline ``pipe`` of ``repo`` tuned as one (``joint``: every composing model's knobs
    in one search, the load to the ensemble, the goal its end-to-end p99) and its stages tuned
    one at a time (``stagewise``: each composing model swept alone with the same scenario, the
    answers assembled); each answer is what its search found (:func:`found`: a winner whose gain
    a run's few validation repeats could not call significant counts, on either side, since one
    side keeping its original config by that rule and the other not compares the rule's noise,
    not the searches); then one instrument measures both trees: Triton started on each,
    :func:`ensemble_capacity`, ``rounds`` times each in the order A B B A ... so that drift of
    the machine hits both alike."""
    scenario = comparison.scenario()
    server = triton_flags(install)
    joint_dir, joint_s = sweep(repo, work / "joint", scenario, *server, "--model", "pipe")
    alone: dict[str, Path] = {}
    stagewise_s = 0.0
    for stage in STAGES:
        alone[stage], seconds = sweep(
            repo, work / f"alone-{stage}", scenario, *server, "--model", stage
        )
        stagewise_s += seconds
    answers = {
        "joint": Answer(
            {"pipe": joint_dir},
            joint_s,
            assemble(repo, {s: found(joint_dir, s) for s in STAGES}, work / "tree-joint"),
        ),
        "stagewise": Answer(
            alone,
            stagewise_s,
            assemble(repo, {s: found(alone[s]) for s in STAGES}, work / "tree-stagewise"),
        ),
    }
    order = ["joint", "stagewise", "stagewise", "joint"] * ((comparison.rounds + 1) // 2)
    for i, which in enumerate(order[: 2 * comparison.rounds]):
        answer = answers[which]
        answer.capacity_rps.append(
            ensemble_capacity(install, answer.tree, work / f"measure-{i}", comparison)
        )
    return answers


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    comparison = Comparison(
        p99_ms=args.p99_ms,
        max_rate_rps=args.max_rate_rps,
        max_delay_us=args.max_delay_us,
        trials=args.trials,
        validate_repeats=args.validate_repeats,
        search=args.search,
        rounds=args.rounds,
        resolution=args.resolution,
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
            "knobs": {m: (r["best"] or {}).get("config") for m, r in runs.items()},
            "recommended": {m: r["recommendation"]["config"] for m, r in runs.items()},
            "search_strategy": {m: r["search_strategy"] for m, r in runs.items()},
            "search_note": {m: r["search_note"] for m, r in runs.items()},
        }

    return {
        "p99_ms": args.p99_ms,
        "infer_device_ms": [args.device_ms, args.per_item_ms],
        "edge_ms": args.edge_ms,
        "trials": args.trials,
        "search": args.search,
        "validate_repeats": args.validate_repeats,
        "resolution": comparison.resolution,
        "joint": described("joint"),
        "stagewise": described("stagewise"),
        "capacity_ratio": (
            round(joint.median_rps / stagewise.median_rps, 3) if stagewise.median_rps > 0 else None
        ),
        "claims": {
            "every capacity > 0": all(c > 0 for c in joint.capacity_rps + stagewise.capacity_rps),
            # "At least", as the instrument can tell: within one step of its capacity search.
            "joint_median >= stagewise_median * (1 - resolution)": (
                joint.median_rps >= stagewise.median_rps * (1 - comparison.resolution)
            ),
        },
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
    rows.append(f"\njoint / stagewise capacity: {result['capacity_ratio']}x\n")
    rows += [
        f"- {text}: **{'held' if held else 'did not hold'}**"
        for text, held in result["claims"].items()
    ]
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
    parser.add_argument(
        "--resolution", type=float, default=0.05, help="the capacity measurements' step"
    )
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
