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
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.rundir.results import environment, load_summary  # noqa: E402
from analyzer.target.triton import managed_triton  # noqa: E402
from tests.support.pipelines import STAGES, make_pipeline_repository  # noqa: E402
from tests.support.real_triton import TritonInstall  # noqa: E402

FORMAT_VERSION = 1
CLI = (sys.executable, "-c", "from analyzer.cli import main; main()")

SCENARIO = """
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
[search]
strategy = "{search}"
"""


def _sweep(
    args: argparse.Namespace, install: TritonInstall, repo: Path, model: str, work: Path
) -> tuple[Path, float]:
    """One ``perfsweep run``: its run directory and wall time."""
    work.mkdir(parents=True, exist_ok=True)
    scenario = work / "scenario.toml"
    scenario.write_text(
        SCENARIO.format(
            max_rate_rps=args.max_rate_rps,
            p99_ms=args.p99_ms,
            max_delay_us=args.max_delay_us,
            trials=args.trials,
            validate_repeats=args.validate_repeats,
            search=args.search,
        )
    )
    run_dir = work / f"run-{model}"
    t0 = time.monotonic()
    done = subprocess.run(
        [
            *CLI,
            *("run", "--scenario", str(scenario), "--server", "triton"),
            *("--triton-server-path", str(install.server_bin), "--no-report"),
            *("--model-repository", str(repo), "--model", model, "--run-dir", str(run_dir)),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"perfsweep run --model {model} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return run_dir, time.monotonic() - t0


def _chosen(run_dir: Path, stage: str | None = None) -> Path:
    """The config.pbtxt a run recommends (its best, else the config it kept) for ``stage``."""
    folder = run_dir / ("best" if (run_dir / "best").exists() else "baseline")
    return folder / stage / "config.pbtxt" if stage else folder / "config.pbtxt"


def _assemble(repo: Path, configs: dict[str, Path], into: Path) -> Path:
    shutil.copytree(repo, into)
    for stage, path in configs.items():
        shutil.copy(path, into / stage / "config.pbtxt")
    return into


def _capacity(args: argparse.Namespace, install: TritonInstall, repo: Path, work: Path) -> float:
    """The ensemble's capacity at the goal, Triton started on ``repo``."""
    triton = managed_triton("pipe", repo, work, install.server_bin, 180.0)
    triton.start()
    try:
        out = work / "capacity.json"
        done = subprocess.run(
            [
                *CLI,
                *("load", "--url", triton.url, "--model", "pipe", "--find-capacity"),
                *("--p99-ms", str(args.p99_ms), "--max-rps", str(args.max_rate_rps)),
                *("--resolution", "0.05", "--output", str(out)),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode not in (0, 1):
            raise SystemExit(f"perfsweep load failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return float(json.loads(out.read_text())["capacity_rps"])
    finally:
        triton.stop()


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    install = TritonInstall.locate()
    repo = make_pipeline_repository(
        work / "models",
        device_ms=args.device_ms,
        per_item_ms=args.per_item_ms,
        edge_ms=args.edge_ms,
    )
    joint_dir, joint_s = _sweep(args, install, repo, "pipe", work / "joint")
    stage_dirs: dict[str, Path] = {}
    stagewise_s = 0.0
    for stage in STAGES:
        stage_dirs[stage], seconds = _sweep(args, install, repo, stage, work / f"alone-{stage}")
        stagewise_s += seconds
    trees = {
        "joint": _assemble(repo, {s: _chosen(joint_dir, s) for s in STAGES}, work / "tree-joint"),
        "stagewise": _assemble(
            repo, {s: _chosen(stage_dirs[s]) for s in STAGES}, work / "tree-stagewise"
        ),
    }
    order = ["joint", "stagewise", "stagewise", "joint"] * ((args.rounds + 1) // 2)
    capacities: dict[str, list[float]] = {"joint": [], "stagewise": []}
    for i, which in enumerate(order[: 2 * args.rounds]):
        capacities[which].append(_capacity(args, install, trees[which], work / f"measure-{i}"))
    joint, stagewise = (statistics.median(capacities[k]) for k in ("joint", "stagewise"))
    return {
        "p99_ms": args.p99_ms,
        "infer_device_ms": [args.device_ms, args.per_item_ms],
        "edge_ms": args.edge_ms,
        "trials": args.trials,
        "search": args.search,
        "validate_repeats": args.validate_repeats,
        "joint": {
            "capacity_rps": capacities["joint"],
            "wall_s": round(joint_s, 1),
            "knobs": load_summary(joint_dir)["best"]["config"],
            "recommended": load_summary(joint_dir)["recommendation"]["config"],
        },
        "stagewise": {
            "capacity_rps": capacities["stagewise"],
            "wall_s": round(stagewise_s, 1),
            "knobs": {s: load_summary(stage_dirs[s])["best"]["config"] for s in STAGES},
            "recommended": {
                s: load_summary(stage_dirs[s])["recommendation"]["config"] for s in STAGES
            },
        },
        "capacity_ratio": round(joint / stagewise, 3) if stagewise > 0 else None,
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
    work = Path(tempfile.mkdtemp(prefix="pipeline_vs_stagewise-"))
    try:
        started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        load_before = os.getloadavg()
        result = run(args, work)
        doc = {
            "format_version": FORMAT_VERSION,
            "kind": "perfsweep.benchmark.pipeline_vs_stagewise",
            "started_at": started,
            "environment": environment("pipeline_vs_stagewise"),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "result": result,
        }
        print(table(result))
        out = (
            args.output or ROOT / "benchmarks" / "results" / f"pipeline_vs_stagewise-{started}.json"
        )
        out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"wrote {out}")
    finally:
        if args.keep:
            shutil.copytree(work, args.keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if re.search(r"\bpytest\b", sys.argv[0]):  # pragma: no cover
        raise SystemExit("run this file directly, not through pytest")
    raise SystemExit(main())
