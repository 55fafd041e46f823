"""Two models on one device, tuned together: perfsweep's joint sweep beside Model Analyzer 1.58's
concurrent quick search, on the same real Triton models, judged by one instrument.

The models are the mix benchmarks' ``rank`` and ``tag`` (benchmarks/mixes.py): Python-backend
models on a real Triton 2.51 (nvidia-pytriton's ``tritonserver``) whose device parts share one
file lock, ``rank`` heavy with a loose goal (400 ms), ``tag`` cheap with a tight one (40 ms), the
traffic 3:4. Both start unbatched on one instance.

* ``perfsweep``: ``perfsweep run --mix rank=3@400,tag=4@40 --server triton`` (a managed Triton;
  every model's knobs in one search, each model held to its own goal, open-loop load of the mix;
  the mix tests' scenario: max batch size 4-32, queue delay 0-4000 us, 1-2 instances).
* ``ma``: ``model-analyzer profile`` in remote mode against a Triton started with explicit model
  control and both models loaded, ``run_config_profile_models_concurrently_enable: true``, quick
  search over max batch size 4-32 and 1-2 instances, each model its own ``perf_latency_p99``
  constraint and ``perf_throughput`` objective. Model Analyzer measures in closed loop, each
  model at a concurrency of its own (it has no notion of the traffic's shares); its pick is the
  first row of its inference table that satisfies the constraints (the table is written best
  first by its own ranking), or, when it had to be stopped before writing one, the passing
  combination of the highest total throughput in its checkpoint.

Wall time is each tool's process from start to answer (perfsweep: the whole ``perfsweep run``,
its managed server's start included; Model Analyzer: its server's start plus ``model-analyzer
profile``). Quality: each answer's repository tree served by a fresh Triton and measured by one
instrument, ``perfsweep load --find-capacity --mix rank=3@400,tag=4@40`` (the largest rate of the
whole mix at which every model meets its own p99), in the order A B B A so drift hits both alike.

Usage::

    bash benchmarks/install_peers.sh                          # Model Analyzer, perf_analyzer
    .venv/bin/python benchmarks/mix_vs_model_analyzer.py      # ~15 min

It prints a markdown table and writes ``benchmarks/results/mix_vs_model_analyzer-<UTC>.json``
(``format_version`` 1). Loopback only; every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from google.protobuf import json_format, text_format  # noqa: E402
from tritonclient.grpc import model_config_pb2 as mc  # noqa: E402

from analyzer.rundir.results import load_summary  # noqa: E402
from analyzer.target.triton import managed_triton  # noqa: E402
from benchmarks.mixes import (  # noqa: E402
    TWO,
    Models,
    TritonServer,
    mix_capacity,
    mix_flag,
    scenario,
)
from benchmarks.record import run_recorded  # noqa: E402
from benchmarks.time_to_answer import MA_BIN, PERF_ANALYZER, watch_ma  # noqa: E402
from tests.support.real_triton import TritonInstall  # noqa: E402
from tests.support.sweeps import assemble, recommended, sweep  # noqa: E402

FORMAT_VERSION = 1

#: The space both tools search.
MIN_BATCH, MAX_BATCH = 4, 32
MAX_INSTANCES = 2


# --------------------------------------------------------------------------------------------
# Model Analyzer's concurrent results (pure: tests/unit/test_mix_vs_model_analyzer.py)


def split_cell(text: str) -> list[str]:
    """One CSV cell of a concurrent row, one value per model: ``"2:CPU,1:CPU"`` -> both;
    a figure written as ``"total, [a,b]"`` -> ``[a, b]``."""
    text = text.strip()
    if "[" in text:
        return [v.strip() for v in text[text.index("[") + 1 : text.rindex("]")].split(",")]
    return [v.strip() for v in text.split(",")]


def parse_concurrent_rows(text: str, models: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of Model Analyzer's ``metrics-model-inference.csv`` for the models profiled
    together (its ``Model`` column names them all, comma-joined), in its order (best first):
    each row's variants by model, whether it satisfies the constraints, and each model's
    throughput and p99."""
    wanted = ",".join(models)
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        row = {k.strip(): (v or "").strip() for k, v in row.items() if k}
        if row.get("Model", "").replace(" ", "") != wanted:
            continue
        variants = split_cell(row["Model Config Path"])
        throughputs = split_cell(row.get("Throughput (infer/sec)", ""))
        p99s = split_cell(row.get("p99 Latency (ms)", ""))
        rows.append(
            {
                "variants": dict(zip(models, variants, strict=True)),
                "satisfies": row.get("Satisfies Constraints", "").lower() in ("yes", "true"),
                "throughput_rps": {
                    m: float(v or 0.0) for m, v in zip(models, throughputs, strict=True)
                },
                "p99_ms": {m: float(v or math.inf) for m, v in zip(models, p99s, strict=True)},
            }
        )
    return rows


def checkpoint_results(doc: Mapping[str, Any], models: Sequence[str]) -> dict[str, Any]:
    """Model Analyzer's checkpoint (``0.ckpt``) of the models profiled together: each measured
    combination (its variants joined by commas) -> each model's config (a ``ModelConfig`` as
    JSON) and every measurement's per-model throughput and p99."""
    combos = doc["ResultManager.results"]["_results"].get(",".join(models), {})
    out: dict[str, Any] = {}
    for key, (run_config, measurements) in combos.items():
        configs = {
            m: rc["_model_config_variant"]["model_config"]
            for m, rc in zip(models, run_config["_model_run_configs"], strict=True)
        }
        points = []
        for measurement in measurements.values():
            per_model = measurement["_model_config_measurements"]
            data = [{k: v["_value"] for k, v in m["_non_gpu_data"]} for m in per_model]
            points.append(
                {
                    "throughput_rps": {
                        m: float(d.get("perf_throughput", 0.0))
                        for m, d in zip(models, data, strict=True)
                    },
                    "p99_ms": {
                        m: float(d.get("perf_latency_p99", math.inf))
                        for m, d in zip(models, data, strict=True)
                    },
                }
            )
        out[key] = {"configs": configs, "measurements": points}
    return out


def ma_pick(
    rows: Sequence[Mapping[str, Any]], results: Mapping[str, Any], goals: Mapping[str, float]
) -> tuple[str, str] | None:
    """Model Analyzer's answer: ``(combination, how it was chosen)``; the first satisfying row
    of its table, else the checkpoint's combination of the highest total throughput among
    measurements where every model met its goal; None when none did."""
    for row in rows:
        if row["satisfies"]:
            return ",".join(row["variants"][m] for m in goals), "its table's first passing row"
    best: tuple[float, str] | None = None
    for key, result in results.items():
        for point in result["measurements"]:
            if all(point["p99_ms"][m] <= goal for m, goal in goals.items()):
                total = sum(point["throughput_rps"].values())
                if best is None or total > best[0]:
                    best = (total, key)
    return None if best is None else (best[1], "the checkpoint's best passing measurement")


def variant_pbtxt(config: Mapping[str, Any], model: str) -> str:
    """A variant's config (JSON, as the checkpoint holds it) as the model's own config.pbtxt."""
    message = json_format.ParseDict(dict(config), mc.ModelConfig(), ignore_unknown_fields=True)
    message.name = model
    return text_format.MessageToString(message)


def knobs(config: Mapping[str, Any]) -> dict[str, Any]:
    """What a variant set of the knobs both tools search."""
    batching = config.get("dynamicBatching")
    return {
        "max_batch_size": int(config.get("maxBatchSize", 0)),
        "dynamic_batching": batching is not None,
        "max_queue_delay_us": int((batching or {}).get("maxQueueDelayMicroseconds", 0)),
        "preferred_batch_size": [int(v) for v in (batching or {}).get("preferredBatchSize", [])],
        "instance_count": sum(int(g.get("count", 1)) for g in config.get("instanceGroup", [{}])),
    }


# --------------------------------------------------------------------------------------------
# The two tools


def run_perfsweep(
    server: TritonServer, models: Models, repo: Path, work: Path, trials: int, max_rps: float
) -> dict[str, Any]:
    text = scenario(models, trials, max_rps)
    run_dir, wall_s = sweep(repo, work, text, *server.flags(), "--mix", mix_flag(models))
    summary = load_summary(run_dir)
    tree = assemble(repo, {m: recommended(run_dir, m) for m in models}, work / "tree")
    return {
        "wall_s": round(wall_s, 1),
        "tree": tree,
        "own_capacity_rps": summary["best"]["throughput_rps"],
        "knobs": summary["best"]["config"]["stages"],
        "recommended": summary["recommendation"]["config"],
    }


def ma_yaml(repo: Path, work: Path, urls: Mapping[str, str], models: Models) -> str:
    profiles = "".join(
        f"""  {name}:
    cpu_only: true
    objectives:
      perf_throughput: 10
    constraints:
      perf_latency_p99:
        max: {m.p99_ms:g}
"""
        for name, m in models.items()
    )
    return f"""\
model_repository: {repo}
triton_launch_mode: remote
triton_http_endpoint: {urls["http"]}
triton_grpc_endpoint: {urls["grpc"]}
triton_metrics_url: {urls["metrics"]}
client_protocol: grpc
perf_analyzer_path: {PERF_ANALYZER}
run_config_search_mode: quick
run_config_profile_models_concurrently_enable: true
run_config_search_min_model_batch_size: {MIN_BATCH}
run_config_search_max_model_batch_size: {MAX_BATCH}
run_config_search_min_instance_count: 1
run_config_search_max_instance_count: {MAX_INSTANCES}
export_path: {work / "export"}
output_model_repository_path: {work / "out"}
override_output_model_repository: true
checkpoint_directory: {work / "ckpt"}
skip_summary_reports: true
profile_models:
{profiles}"""


def run_ma(
    install: TritonInstall, models: Models, repo: Path, work: Path, timeout_s: float
) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "export").mkdir(exist_ok=True)
    names = list(models)
    started = time.perf_counter()
    first, *others = names
    triton = managed_triton(first, repo, work, install.server_bin, 180.0, also_load=others)
    triton.start()
    try:
        assert triton.ports is not None
        urls = {
            "http": f"127.0.0.1:{triton.ports.http}",
            "grpc": f"127.0.0.1:{triton.ports.grpc}",
            "metrics": f"http://127.0.0.1:{triton.ports.metrics}/metrics",
        }
        (work / "ma.yaml").write_text(ma_yaml(repo, work, urls, models))
        log = work / "ma.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                [str(MA_BIN), "profile", "-f", str(work / "ma.yaml")],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=work,
            )
            cycling_at = watch_ma(process, log, started, timeout_s)
    finally:
        triton.stop()
    result: dict[str, Any] = {
        "wall_s": round((cycling_at or time.perf_counter()) - started, 1),
        "exit_code": process.returncode,
        "stopped_cycling": cycling_at is not None,
        "timed_out": time.perf_counter() - started > timeout_s,
    }
    checkpoint = work / "ckpt" / "0.ckpt"
    if not checkpoint.is_file():
        result["error"] = log.read_text(errors="replace")[-3000:]
        return result
    results = checkpoint_results(json.loads(checkpoint.read_text()), names)
    table = work / "export" / "results" / "metrics-model-inference.csv"
    rows = parse_concurrent_rows(table.read_text(), names) if table.is_file() else []
    result["measurements"] = sum(len(r["measurements"]) for r in results.values())
    result["combinations"] = len(results)
    pick = ma_pick(rows, results, {m: spec.p99_ms for m, spec in models.items()})
    if pick is None:
        result["error"] = "no measured combination met every model's goal"
        return result
    key, how = pick
    configs = results[key]["configs"]
    pbtxts = work / "pick"
    for m in names:
        (pbtxts / m).mkdir(parents=True, exist_ok=True)
        (pbtxts / m / "config.pbtxt").write_text(variant_pbtxt(configs[m], m))
    result.update(
        {
            "pick": key,
            "chosen_by": how,
            "knobs": {m: knobs(configs[m]) for m in names},
            "tree": assemble(repo, {m: pbtxts / m / "config.pbtxt" for m in names}, work / "tree"),
        }
    )
    return result


# --------------------------------------------------------------------------------------------
# One run


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    install = TritonInstall.locate()
    server = TritonServer(install)
    repo = server.write(work / "models" / "repo", TWO)
    tools = {
        "perfsweep": run_perfsweep(
            server, TWO, repo, work / "perfsweep", args.trials, args.max_rate_rps
        ),
        "ma": run_ma(install, TWO, repo, work / "ma", args.ma_timeout_s),
    }
    judged = [name for name in ("perfsweep", "ma") if "tree" in tools[name]]
    order = (judged + judged[::-1]) * args.rounds
    for name in tools:
        tools[name]["capacity_rps"] = []
    for i, name in enumerate(order):
        tools[name]["capacity_rps"].append(
            mix_capacity(
                server,
                TWO,
                tools[name]["tree"],
                work / f"measure-{i}-{name}",
                max_rps=args.max_rate_rps,
                resolution=args.resolution,
            )
        )
    for tool in tools.values():
        tool["tree"] = str(tool.get("tree", ""))
        caps = tool["capacity_rps"]
        tool["median_capacity_rps"] = statistics.median(caps) if caps else None
    ps, ma = tools["perfsweep"], tools["ma"]
    return {
        "models": {
            name: {"share": m.share, "p99_ms": m.p99_ms, "device_ms": [m.a_ms, m.b_ms]}
            for name, m in TWO.items()
        },
        "mix": mix_flag(TWO),
        "trials": args.trials,
        "tools": tools,
        "capacity_ratio": (
            round(ps["median_capacity_rps"] / ma["median_capacity_rps"], 3)
            if ma.get("median_capacity_rps")
            else None
        ),
        "wall_ratio": round(ps["wall_s"] / ma["wall_s"], 3) if ma.get("wall_s") else None,
    }


def table(result: Mapping[str, Any]) -> str:
    rows = [
        "| tool | mix capacity, every goal met (req/s, each measurement) | median | wall time (s) |",
        "|---|---|---|---|",
    ]
    for name, tool in result["tools"].items():
        caps = ", ".join(f"{c:.1f}" for c in tool["capacity_rps"]) or "-"
        median = tool["median_capacity_rps"]
        rows.append(
            f"| {name} | {caps} | {'-' if median is None else f'{median:.1f}'} "
            f"| {tool.get('wall_s', '-')} |"
        )
    rows.append(
        f"\nperfsweep / Model Analyzer: capacity {result['capacity_ratio']}x, "
        f"wall time {result['wall_ratio']}x"
    )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6, help="perfsweep's trials")
    parser.add_argument("--max-rate-rps", type=float, default=600.0)
    parser.add_argument("--resolution", type=float, default=0.05, help="the judge's step")
    parser.add_argument("--rounds", type=int, default=1, help="A B B A rounds of the judge")
    parser.add_argument("--ma-timeout-s", type=float, default=2400.0)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--keep", type=Path, help="copy the work directory here")
    args = parser.parse_args()
    if not MA_BIN.exists():
        raise SystemExit(f"{MA_BIN} missing: bash benchmarks/install_peers.sh")
    return run_recorded(
        "mix_vs_model_analyzer",
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
