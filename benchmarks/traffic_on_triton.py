"""Your traffic on a real Triton: a sweep for Poisson arrivals beside a sweep that replays a trace,
each pick judged again under both, and the simulator's error under the trace.

One real Triton (nvidia-pytriton's ``tritonserver``) serves the GPU-like Python-backend model of
``time_to_answer.py`` (host part overlapping across instances, device part serialised by a file
lock); every step below runs against it, in one run:

1. ``perfsweep run --search predict`` with Poisson arrivals: the Poisson pick, its capacity;
2. the same with ``--trace TRACE`` (default ``examples/traces/bursty-minute.csv``, scaled to each
   level's rate): the trace pick, its capacity under the trace, and the simulator's predictions
   for every config of the space under the same trace;
3. each pick loaded into Triton and judged by ``perfsweep load --find-capacity``, once with
   Poisson arrivals and once with ``--trace``: the 2 x 2 table of capacities at the goal.

The prediction error is ``|predicted - measured| / measured`` (the definition of
``time_to_answer.py``) over every capacity measured under the trace: the trace run's measurements, its baseline
included (a measurement that met the goal up to the highest rate tried is a lower bound, left
out), and the two judges under the trace.

Usage::

    .venv/bin/python benchmarks/traffic_on_triton.py                    # ~9 min here
    .venv/bin/python benchmarks/traffic_on_triton.py --quick            # the quick space and budgets

It prints a markdown table and writes ``benchmarks/results/traffic_on_triton-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from time_to_answer import (  # noqa: E402
    TritonTarget,
    config_key,
    error_stats,
    perfsweep_run,
    predictions,
    relative_errors,
    scenario_doc,
    trial_capacities,
    write_scenario,
)

DEFAULT_TRACE = ROOT / "examples" / "traces" / "bursty-minute.csv"


def judge(
    target: TritonTarget, config_text: str, arrival_args: list[str], p99_ms: float, out: Path
) -> dict[str, Any]:
    """Load ``config_text`` into Triton and search its capacity at ``p99_ms`` with
    ``perfsweep load --find-capacity`` under the given arrivals."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    target.triton.load_model(target.model, text_format.Parse(config_text, mc.ModelConfig()))
    cmd = [
        str(Path(sys.executable).with_name("perfsweep")),
        "load",
        "--url",
        target.triton.http_url,
        "--model",
        target.model,
        "--find-capacity",
        "--p99-ms",
        str(p99_ms),
        "--start-rps",
        "50",
        "--max-rps",
        "1000",
        *arrival_args,
        "--output",
        str(out),
    ]
    started = time.perf_counter()
    with out.with_suffix(".log").open("w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=1200)
    result: dict[str, Any] = {
        "command": " ".join(cmd[1:]),
        "exit_code": done.returncode,
        "wall_s": time.perf_counter() - started,
    }
    if out.is_file():
        result["capacity_rps"] = json.loads(out.read_text()).get("capacity_rps")
    else:
        result["error"] = out.with_suffix(".log").read_text()[-2000:]
    return result


def trace_errors(run_dir: Path, judged: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The simulator's error under the trace: its prediction (the trace run's, which simulates
    every config of the space under the trace) against each capacity measured under the trace,
    the trace run's own trials and the judges' ``perfsweep load --trace`` of both picks."""
    predicted = predictions(run_dir)
    pairs = [
        (predicted[key], t["capacity_rps"])
        for t in trial_capacities(run_dir)
        if t["capacity_rps"] and t["bracketed"] and (key := config_key(t["config"])) in predicted
    ]
    for pick, config in (("poisson", "run-poisson"), ("trace", "run-trace")):
        summary = json.loads((run_dir.parent / config / "summary.json").read_text())
        key = config_key(summary["best"]["config"])
        measured = judged[f"{pick}/trace"].get("capacity_rps")
        if measured and key in predicted:
            pairs.append((predicted[key], measured))
    errors = relative_errors(pairs)
    return {"pairs": pairs, **error_stats(errors)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--quick", action="store_true", help="the quick space and budgets")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="traffic-"))
    workdir.mkdir(parents=True, exist_ok=True)
    doc = scenario_doc("triton", args.quick)
    p99_ms = float(doc["goals"]["p99_ms"])
    scenario = write_scenario(doc, workdir / "scenario.toml")
    trace_args = ["--trace", str(args.trace)]
    target = TritonTarget(workdir)
    runs: dict[str, dict[str, Any]] = {}
    judged: dict[str, dict[str, Any]] = {}
    try:
        for name, extra in (("poisson", []), ("trace", trace_args)):
            print(f"perfsweep run --search predict ({name}) ...", flush=True)
            target.reset()
            runs[name] = perfsweep_run(
                name,
                [*target.perfsweep_args(), *extra],
                scenario,
                "predict",
                workdir / f"run-{name}",
                timeout_s=3600,
            )
            if runs[name].get("error"):
                print(runs[name]["error"], file=sys.stderr)
                return 1
        for pick in ("poisson", "trace"):
            config_text = (workdir / f"run-{pick}" / "best" / "config.pbtxt").read_text()
            for arrivals, extra in (("poisson", []), ("trace", trace_args)):
                print(f"perfsweep load --find-capacity: {pick} pick, {arrivals} ...", flush=True)
                judged[f"{pick}/{arrivals}"] = judge(
                    target, config_text, extra, p99_ms, workdir / f"judge-{pick}-{arrivals}.json"
                )
    finally:
        target.close()

    errors = trace_errors(workdir / "run-trace", judged)
    result = {
        "benchmark": "traffic_on_triton",
        "trace": str(
            args.trace.relative_to(ROOT) if args.trace.is_relative_to(ROOT) else args.trace
        ),
        "p99_ms": p99_ms,
        "quick": args.quick,
        "runs": runs,
        "judged": judged,
        "trace_prediction_error": errors,
    }
    print()
    print(
        f"goal p99 <= {p99_ms:g} ms; capacities in req/s, judged by perfsweep load --find-capacity"
    )
    print()
    print("| pick | config | sweep's own capacity | judged, Poisson | judged, trace |")
    print("|---|---|---|---|---|")
    for pick in ("poisson", "trace"):
        run = runs[pick]
        config = run.get("config") or {}
        short = (
            f"mbs={config.get('max_batch_size')} delay={config.get('max_queue_delay_us')}us "
            f"x{config.get('instance_count')}"
        )
        cells = [judged[f"{pick}/{a}"].get("capacity_rps") for a in ("poisson", "trace")]
        shown = [f"{c:.0f}" if c else "-" for c in cells]
        print(
            f"| {pick} | {short} | {run.get('own_capacity_rps') or 0:.0f} | "
            f"{shown[0]} | {shown[1]} |"
        )
    if errors.get("n"):
        print(
            f"\nsimulator under the trace: median error {errors['median']:.0%} over "
            f"{errors['n']} measured capacities (worst {errors['worst']:.0%})"
        )
    print(
        "wall time: "
        + ", ".join(f"{k} sweep {v['wall_s']:.0f} s" for k, v in runs.items())
        + f", judging {sum(j['wall_s'] for j in judged.values()):.0f} s"
    )
    out_dir = ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out_dir / f"traffic_on_triton-{stamp}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
