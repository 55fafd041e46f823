"""Time to answer: wall time and quality of perfsweep's searches beside Model Analyzer's.

For each target, in one run, on one small space (max batch size 1-16 as powers of two, queue delay
{0, 2000 us}, no preferred sizes, 1-2 instances: 20 configs):

* ``predict``: ``perfsweep run --search predict`` (profile, simulate every config, measure the
  predicted best first), ``--predict-runs`` times (default 3: its wall time turns on whether its
  first measurement lands in the band, so one run is an anecdote); the table gives each run and
  their median, the first run's predictions give the prediction error;
* ``tpe``: ``perfsweep run --search tpe``, same scenario and budgets: TPE picks the configs, but
  with everything else built alongside predictions (sequential steps, capacity searches started near a
  neighbour's capacity, one warm-up per config, the baseline measured once, validation by one
  check), so predict over tpe is what the prediction alone buys;
* ``before``: ``perfsweep run`` of commit ``--before`` (default :data:`BEFORE_COMMIT`, the last
  one before sequential steps and predict-then-verify: perfsweep's TPE search with fixed
  windows), checked out with ``git archive`` into the work directory and run from there, same
  scenario and budgets (less the keys it does not know: ``[search]``, ``budget.validation``);
* ``ma``: Model Analyzer 1.58 quick search (remote mode, the server started with explicit model
  control, ``run_config_search_max_model_batch_size`` / ``_max_instance_count`` at the space's
  bounds, goal ``perf_latency_p99 <= goal``, objective ``perf_throughput``);
* ``grid``: ``perfsweep run --search grid`` over every config of the space: the brute force,
  with each capacity resolved to ``--grid-resolution`` (default 5 %; the tools' own scenario
  stops at 20 %).

Wall time is each tool's process from start to recommendation (perfsweep: the whole ``perfsweep
run``, its managed server's start included; Model Analyzer: the server's start plus ``model-analyzer
profile``). Quality is the capacity at the goal of a tool's recommended config divided by the best
capacity of the grid, both read from ONE instrument: the grid's own measurement of every config
(perfsweep's open-loop capacity search, the scenario's budgets but a capacity bracket of at most
``--grid-resolution``: at the scenario's 20 % every grid capacity is the lower end of a bracket
20 % wide, so two configs 10 % apart could read either way round and a quality below 100 % said
nothing about the tool). A recommendation outside the space
(Model Analyzer may keep the model's default config) is measured by a one-config grid run with
the same settings. Prediction error is ``|predicted - measured| / measured`` of the predict run's
simulator over the configs its own run measured and over the grid (measurements that met the goal
up to the highest rate tried are lower bounds, left out).

Targets:

* ``sim``: the reference server's simulated device (``--device sim``) running the bundled
  ``resnet50_sim`` profile at ``1 / SIM_SLOWDOWN`` of its speed (every duration, device and host,
  times ``SIM_SLOWDOWN``; a repository written here, the resnet50 config on the simulated
  backend) with the goal times ``SIM_SLOWDOWN`` too. ``SIM_SLOWDOWN`` is 1: the bundled profile
  itself now puts the best configs (~260 req/s at the 60 ms goal) well inside the ~600 req/s of
  224x224 images that this machine's load generator offers beside the server (it was 2 while
  the bundled device ran 2.5x faster, and half of the space met the goal at that ceiling);
  ``scenarios/resnet50.sim.toml`` with the small space;
* ``triton``: a real Triton (nvidia-pytriton's ``tritonserver``) with a Python-backend model
  written here, GPU-like: each execution's host part overlaps across instances, its device part
  (``DEVICE_BASE_MS + DEVICE_PER_ITEM_MS * batch``) is serialised across instances by a file lock.

Usage::

    bash benchmarks/install_peers.sh                                      # Model Analyzer, perf_analyzer
    .venv/bin/python benchmarks/time_to_answer.py --target sim            # ~25 min
    .venv/bin/python benchmarks/time_to_answer.py --target triton         # ~25 min
    .venv/bin/python benchmarks/time_to_answer.py --target sim --quick    # smoke, ~7 min
    .venv/bin/python benchmarks/time_to_answer.py --target triton --no-ma --before ''

It prints a markdown table and writes ``benchmarks/results/time_to_answer-<target>-<UTC>.json``
(``format_version`` 1, the environment, each tool's wall time, recommendation and capacity, the
grid, the prediction errors). Loopback only; every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FORMAT_VERSION = 1
#: The last commit before sequential steps and predict-then-verify: perfsweep's TPE search with
#: fixed windows (19 min 50 s on the Triton it was first timed on).
BEFORE_COMMIT = "20d9d70"
#: The tools predict's wall time is divided by (name in ``tools``, column heading).
PEERS = (("before", "before"), ("tpe", "tpe"), ("ma", "MA"))
MA_BIN = Path("/opt/peers/ma/bin/model-analyzer")
PERF_ANALYZER = Path("/opt/peers/bin/perf_analyzer")

#: The small space every tool searches (scenario ``[space]``).
SPACE: dict[str, Any] = {
    "max_batch_size": [1, 16],
    "max_queue_delay_us": [0, 2000],
    "delay_steps": 2,
    "preferred_batch_size": "none",
    "instance_count": [1, 2],
}
QUICK_SPACE: dict[str, Any] = {
    "max_batch_size": [1, 4],
    "max_queue_delay_us": [0, 0],
    "delay_steps": 1,
    "preferred_batch_size": "none",
    "instance_count": [1, 1],
}

# GPU-like Python-backend model of the triton target (ms).
HOST_MS = 2.0
DEVICE_BASE_MS = 10.0
DEVICE_PER_ITEM_MS = 1.0
TRITON_P99_MS = 100.0

# The sim target: the bundled profile's durations times this, and its goal with them.
SIM_SLOWDOWN = 1.0
SIM_P99_MS = 60.0 * SIM_SLOWDOWN

Key = tuple[int, int, tuple[int, ...], int]


# --------------------------------------------------------------------------------------------
# Pure helpers (tests/unit/test_time_to_answer.py)


def config_key(config: Mapping[str, Any]) -> Key:
    """A config dict (trial record / summary form) as a hashable key."""
    return (
        int(config["max_batch_size"]),
        int(config.get("max_queue_delay_us") or 0),
        tuple(int(s) for s in config.get("preferred_batch_size") or ()),
        int(config.get("instance_count") or 1),
    )


def quality(capacities: Mapping[Key, float], space: Iterable[Key], config: Key) -> float | None:
    """Capacity of ``config`` over the best capacity of the ``space`` configs (None: unmeasured)."""
    best = max((capacities[k] for k in space if k in capacities), default=0.0)
    if config not in capacities or best <= 0:
        return None
    return capacities[config] / best


def relative_errors(pairs: Iterable[tuple[float, float]]) -> list[float]:
    """``|pred - meas| / meas`` of each (predicted, measured) pair with a positive measurement."""
    return [abs(p - m) / m for p, m in pairs if m > 0]


def error_stats(errors: Sequence[float]) -> dict[str, Any]:
    """Count, median and worst of relative errors (None when there are none)."""
    if not errors:
        return {"n": 0, "median": None, "worst": None}
    return {"n": len(errors), "median": statistics.median(errors), "worst": max(errors)}


def parse_ma_metrics(text: str) -> list[dict[str, Any]]:
    """Rows of Model Analyzer's ``metrics-model-inference.csv`` as config and figures.

    Columns used (its default ``inference_output_fields``): ``Model Config Path``, ``Instance
    Group`` (``"2:CPU"``), ``Max Batch Size``, ``Concurrency``, ``Satisfies Constraints``,
    ``Throughput (infer/sec)``, ``p99 Latency (ms)``. Quick mode never sets a queue delay or
    preferred sizes (``dynamic_batching {}``).
    """
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        row = {k.strip(): (v or "").strip() for k, v in row.items() if k}
        if not row.get("Model Config Path"):
            continue
        group = row.get("Instance Group", "1:CPU")
        count = sum(int(part.split(":")[0]) for part in group.split("/") if part.split(":")[0])
        rows.append(
            {
                "name": row["Model Config Path"],
                "max_batch_size": int(row.get("Max Batch Size") or 0),
                "instance_count": count or 1,
                "concurrency": int(float(row.get("Concurrency") or 0)),
                "satisfies": row.get("Satisfies Constraints", "").lower() in ("yes", "true"),
                "throughput_rps": float(row.get("Throughput (infer/sec)") or 0.0),
                "p99_ms": float(row.get("p99 Latency (ms)") or math.inf),
            }
        )
    return rows


def ma_recommendation(rows: Sequence[Mapping[str, Any]], p99_ms: float) -> dict[str, Any] | None:
    """Model Analyzer's top config: the highest throughput among rows meeting the p99 goal."""
    ok = [r for r in rows if r["p99_ms"] <= p99_ms]
    if not ok:
        return None
    return dict(max(ok, key=lambda r: r["throughput_rps"]))


def dump_toml(doc: Mapping[str, Mapping[str, Any]], top: Mapping[str, Any]) -> str:
    """A scenario file: top-level keys, then one table per section (scalars and flat lists)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, str):
            return json.dumps(v)
        return repr(v)

    lines = [f"{k} = {value(v)}" for k, v in top.items()]
    for section, body in doc.items():
        lines += ["", f"[{section}]"] + [f"{k} = {value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Scenarios


def scenario_doc(target: str, quick: bool, base_text: str | None = None) -> dict[str, Any]:
    """The scenario every perfsweep run of ``target`` uses (the grid adds budget overrides),
    on ``base_text`` (another version's ``scenarios/resnet50.sim.toml``; default this one's)."""
    base = tomllib.loads(base_text or (ROOT / "scenarios" / "resnet50.sim.toml").read_text())
    base["space"] = dict(QUICK_SPACE if quick else SPACE)
    base["run"] = {"seed": 0}
    if target == "sim":
        base["goals"] = {"p99_ms": SIM_P99_MS, "max_error_rate": 0.01}
    if target == "triton":
        base["model"] = {"name": "gpulike"}
        base["traffic"].update({"start_rps": 50.0, "max_rate_rps": 1000.0})
        base["goals"] = {"p99_ms": TRITON_P99_MS, "max_error_rate": 0.01}
    if quick:
        base["budget"].update({"trials": 2, "time_budget_s": 150, "validate_top": 0})
        if "search" in base:
            base["search"]["profile_time_s"] = 15.0
    return base


class Before:
    """perfsweep at an earlier commit, run from a ``git archive`` of it (its own ``analyzer`` and
    ``reference_server``, this venv's packages)."""

    def __init__(self, commit: str, workdir: Path) -> None:
        self.commit = commit
        self.src = workdir / f"before-{commit}"
        self.src.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", commit],
            check=True,
            capture_output=True,
        )
        subprocess.run(["tar", "-x", "-C", str(self.src)], input=archive.stdout, check=True)

    def scenario_doc(self, target: str, quick: bool) -> dict[str, Any]:
        """:func:`scenario_doc` on this version's own scenario file, less the keys it does not
        know (``[search]``, ``budget.validation``)."""
        doc = scenario_doc(
            target, quick, (self.src / "scenarios" / "resnet50.sim.toml").read_text()
        )
        doc.pop("search", None)
        doc["budget"].pop("validation", None)
        return doc

    def program(self) -> list[str]:
        # Run from the archive's directory: `python -c` puts the working directory first on
        # sys.path, so its analyzer (and the reference_server it starts) is the one imported.
        return [sys.executable, "-c", "import sys; from analyzer.cli import main; sys.exit(main())"]


def write_scenario(doc: Mapping[str, Any], path: Path, **overrides: dict[str, Any]) -> Path:
    sections = {k: dict(v) for k, v in doc.items() if isinstance(v, dict)}
    for section, values in overrides.items():
        sections.setdefault(section, {}).update(values)
    top = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    path.write_text(dump_toml(sections, top))
    return path


def space_keys(space: Mapping[str, Any]) -> list[Key]:
    """Every config of the space, as the sweep enumerates it."""
    from analyzer.config.scenario import load_scenario
    from analyzer.sweep.loop import space_for

    s = load_scenario(None, {f"space.{k}": v for k, v in space.items()}, env={})
    search_space = space_for(s)
    keys = [config_key(search_space.decode(p).to_dict()) for p in search_space.points()]
    return list(dict.fromkeys(keys))


# --------------------------------------------------------------------------------------------
# Runs


def perfsweep_run(
    name: str,
    target_args: Sequence[str],
    scenario: Path,
    search: str | None,
    run_dir: Path,
    timeout_s: float,
    before: Before | None = None,
) -> dict[str, Any]:
    """One ``perfsweep run`` as a subprocess; wall time, recommendation, measured trials.
    ``search`` None: the version's default (``before``: an earlier version, which has no
    ``--search``)."""
    program = before.program() if before else [str(Path(sys.executable).with_name("perfsweep"))]
    cmd = [
        *program,
        "run",
        *target_args,
        "--scenario",
        str(scenario),
        *(["--search", search] if search else []),
        "--run-dir",
        str(run_dir),
    ]
    log = run_dir.with_suffix(".log")
    started = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            cwd=before.src if before else None,
        )
    wall_s = time.perf_counter() - started
    result: dict[str, Any] = {
        "tool": name,
        "wall_s": wall_s,
        "exit_code": done.returncode,
        "command": " ".join(cmd[len(program) :]),
        "commit": before.commit if before else None,
        "run_dir": str(run_dir),
    }
    if done.returncode != 0 or not (run_dir / "summary.json").is_file():
        result["error"] = log.read_text()[-2000:]
        return result
    summary = json.loads((run_dir / "summary.json").read_text())
    best = summary.get("best")
    result.update(
        {
            "config": best["config"] if best else None,
            "own_capacity_rps": best["throughput_rps"] if best else None,
            "stop_reason": summary.get("stop_reason"),
            "trials": summary.get("trials"),
            "phases": summary.get("phases"),
            "search_strategy": summary.get("search_strategy"),
            "measured": trial_capacities(run_dir),
        }
    )
    return result


def trial_capacities(run_dir: Path) -> list[dict[str, Any]]:
    """Every measured trial of a run directory (the baseline included) with its prediction."""
    out = []
    for path in sorted(run_dir.glob("*/measurement.json")) + sorted(
        run_dir.glob("trials/*/measurement.json")
    ):
        r = json.loads(path.read_text())
        m = r.get("measurement") or {}
        out.append(
            {
                "trial": path.parent.name,
                "config": r["config"],
                "capacity_rps": r.get("throughput_rps") if r.get("state") == "complete" else None,
                "bracketed": m.get("bracketed", True),
                "prediction_rps": (r.get("prediction") or {}).get("capacity_rps"),
            }
        )
    return out


def predictions(run_dir: Path) -> dict[Key, float]:
    path = run_dir / "predictions.json"
    if not path.is_file():
        return {}
    doc = json.loads(path.read_text())
    return {config_key(c["config"]): c["capacity_rps"] for c in doc["configs"]}


def ma_run(
    workdir: Path,
    *,
    http: str,
    grpc: str,
    metrics: str,
    model: str,
    pbtxt: str,
    space: Mapping[str, Any],
    p99_ms: float,
    timeout_s: float,
) -> dict[str, Any]:
    """Model Analyzer's quick search in remote mode against a running server."""
    repo = workdir / "repo" / model
    (repo / "1").mkdir(parents=True, exist_ok=True)
    (repo / "config.pbtxt").write_text(pbtxt)
    export = workdir / "export"
    export.mkdir(exist_ok=True)
    config = f"""\
model_repository: {workdir / "repo"}
triton_launch_mode: remote
triton_http_endpoint: {http}
triton_grpc_endpoint: {grpc}
triton_metrics_url: {metrics}
client_protocol: grpc
perf_analyzer_path: {PERF_ANALYZER}
run_config_search_mode: quick
run_config_search_min_model_batch_size: {space["max_batch_size"][0]}
run_config_search_max_model_batch_size: {space["max_batch_size"][1]}
run_config_search_min_instance_count: {space["instance_count"][0]}
run_config_search_max_instance_count: {space["instance_count"][1]}
export_path: {export}
output_model_repository_path: {workdir / "out"}
override_output_model_repository: true
checkpoint_directory: {workdir / "ckpt"}
skip_summary_reports: true
profile_models:
  {model}:
    cpu_only: true
    objectives:
      perf_throughput: 10
    constraints:
      perf_latency_p99:
        max: {p99_ms:g}
"""
    (workdir / "ma.yaml").write_text(config)
    log = workdir / "ma.log"
    result: dict[str, Any] = {"tool": "ma"}
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(MA_BIN), "profile", "-f", str(workdir / "ma.yaml")],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
        cycling_at = watch_ma(process, log, started, timeout_s)
    result["wall_s"] = (cycling_at or time.perf_counter()) - started
    result["exit_s"] = time.perf_counter() - started
    result["exit_code"] = process.returncode
    result["stopped_cycling"] = cycling_at is not None
    csv_path = export / "results" / "metrics-model-inference.csv"
    checkpoint = workdir / "ckpt" / "0.ckpt"
    if csv_path.is_file():
        rows = parse_ma_metrics(csv_path.read_text())
        result["source"] = str(csv_path.name)
    elif checkpoint.is_file():
        rows = parse_ma_checkpoint(json.loads(checkpoint.read_text()), model)
        result["source"] = "checkpoint"
    else:
        result["error"] = log.read_text()[-2000:]
        return result
    best = ma_recommendation(rows, p99_ms)
    result["measurements"] = len(rows)
    result["rows"] = rows
    if best is not None:
        result["recommended_name"] = best["name"]
        result["own_capacity_rps"] = best["throughput_rps"]
        result["config"] = {
            "max_batch_size": best["max_batch_size"],
            "max_queue_delay_us": best.get("max_queue_delay_us", 0),
            "preferred_batch_size": [],
            "instance_count": best["instance_count"],
        }
    return result


#: Consecutive "Skipping profile" lines after the last new measurement that mean Model
#: Analyzer's quick search cycles among configs it has measured (seen here at an instance-count
#: bound of 2: it proposes the same measured neighbours forever and never stops by itself).
MA_CYCLE_SKIPS = 200


def watch_ma(
    process: subprocess.Popen[bytes], log: Path, started: float, timeout_s: float
) -> float | None:
    """Wait for Model Analyzer; SIGINT it once it cycles. Returns when the cycling was seen."""
    cycling_at = None
    while process.poll() is None:
        time.sleep(1.0)  # polling a child's log, not synchronising a test
        text = log.read_text(errors="replace")
        tail = text[text.rfind("Profiling ") :] if "Profiling " in text else text
        if cycling_at is None and tail.count("Skipping profile") >= MA_CYCLE_SKIPS:
            cycling_at = time.perf_counter()
            process.send_signal(signal.SIGINT)  # it then saves its checkpoint and exits
        if time.perf_counter() - started > timeout_s:
            process.kill()
    process.wait()
    return cycling_at


def parse_ma_checkpoint(doc: Mapping[str, Any], model: str) -> list[dict[str, Any]]:
    """Every measurement in Model Analyzer's checkpoint (``0.ckpt``), as parse_ma_metrics rows.

    Used when Model Analyzer was stopped before it wrote its CSV (it writes it only at the end).
    """
    rows = []
    variants = doc["ResultManager.results"]["_results"].get(model, {})
    for name, (run_config, measurements) in variants.items():
        mc = run_config["_model_run_configs"][0]["_model_config_variant"]["model_config"]
        batching = mc.get("dynamicBatching")
        for measurement in measurements.values():
            for m in measurement["_model_config_measurements"]:
                data = {k: v["_value"] for k, v in m["_non_gpu_data"]}
                rows.append(
                    {
                        "name": name,
                        "max_batch_size": int(mc.get("maxBatchSize", 0)),
                        "max_queue_delay_us": int(
                            (batching or {}).get("maxQueueDelayMicroseconds", 0)
                        ),
                        "dynamic_batching": batching is not None,
                        "instance_count": sum(
                            int(g.get("count", 1)) for g in mc.get("instanceGroup", [{}])
                        ),
                        "concurrency": int(
                            m["_model_specific_pa_params"].get("concurrency-range") or 0
                        ),
                        "throughput_rps": float(data.get("perf_throughput", 0.0)),
                        "p99_ms": float(data.get("perf_latency_p99", math.inf)),
                    }
                )
    return rows


# --------------------------------------------------------------------------------------------
# Targets


def slowed_profile(slowdown: float) -> str:
    """The bundled ``resnet50_sim`` profile TOML with every duration times ``slowdown``."""
    doc = tomllib.loads(
        (ROOT / "reference_server" / "zoo" / "profiles" / "resnet50_sim.toml").read_text()
    )
    doc["name"] = f"resnet50_sim_x{slowdown:g}"
    doc["provenance"] = f"{doc['provenance']} Every duration times {slowdown:g} (time_to_answer)."
    doc["device"]["table"] = [[b, ms * slowdown] for b, ms in doc["device"]["table"]]
    for phase in ("host_pre", "host_post"):
        doc[phase] = {k: v * slowdown for k, v in doc[phase].items()}
    top = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    return dump_toml({k: v for k, v in doc.items() if isinstance(v, dict)}, top)


class SimTarget:
    """The reference server's simulated device at ``1 / SIM_SLOWDOWN`` of the bundled profile's
    speed, in a repository written here; perfsweep manages its own server, MA gets one here."""

    name = "sim"
    model = "resnet50"
    p99_ms = SIM_P99_MS

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.process: subprocess.Popen[str] | None = None
        self.repository = workdir / "repository"
        model_dir = self.repository / self.model
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        (model_dir / "device.toml").write_text(slowed_profile(SIM_SLOWDOWN))
        (model_dir / "config.pbtxt").write_text(self.ma_pbtxt())

    def perfsweep_args(self) -> list[str]:
        return [
            *("--model", self.model, "--model-repository", str(self.repository)),
            *("--device", "sim"),
        ]

    def start_for_ma(self) -> dict[str, str]:
        from reference_server.ready import parse_ready_line

        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "reference_server", "--model", self.model),
                *("--model-repository", str(self.repository)),
                *("--device", "sim", "--http-port", "0", "--grpc-port", "0"),
                *("--metrics-port", "0"),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=(self.workdir / "reference_server.log").open("w"),
            text=True,
        )
        assert self.process.stdout is not None
        for line in self.process.stdout:
            addresses = parse_ready_line(line)
            if addresses is not None:
                return {
                    "http": f"127.0.0.1:{addresses.http_port}",
                    "grpc": f"127.0.0.1:{addresses.grpc_port}",
                    "metrics": f"http://127.0.0.1:{addresses.metrics_port}/metrics",
                }
        raise RuntimeError("reference server exited before its ready line")

    def ma_pbtxt(self) -> str:
        return (
            'name: "resnet50"\nbackend: "simulated"\nmax_batch_size: 32\n'
            'input [ { name: "input" data_type: TYPE_FP32 dims: [3, 224, 224] } ]\n'
            'output [ { name: "output" data_type: TYPE_FP32 dims: [1000] } ]\n'
            "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
            'parameters { key: "sim_device" value: { string_value: "sim-gpu0" } }\n'
            'parameters { key: "profile" value: { string_value: "device.toml" } }\n'
        )

    def stop_for_ma(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def close(self) -> None:
        self.stop_for_ma()


class TritonTarget:
    """A real Triton serving the GPU-like Python-backend model; one server for every tool."""

    name = "triton"
    model = "gpulike"
    p99_ms = TRITON_P99_MS

    def __init__(self, workdir: Path) -> None:
        from tests.support.real_triton import (
            RealTriton,
            TensorSpec,
            TritonInstall,
            dynamic_batching,
            locked_device_source,
            sleep_model_config,
        )

        self.config = sleep_model_config(
            self.model,
            max_batch_size=16,
            inputs=(TensorSpec(name="INPUT0", dims=(16,)),),
            dynamic_batching=dynamic_batching(),
        )
        self.triton = RealTriton(TritonInstall.locate(), workdir / "triton")
        source = locked_device_source(
            workdir / "device.lock", HOST_MS, DEVICE_BASE_MS, DEVICE_PER_ITEM_MS
        )
        self.triton.workdir.mkdir(parents=True, exist_ok=True)
        self.triton.add_model(self.config, model_source=source)
        self.triton.start()
        self.triton.load_model(self.model)

    def reset(self) -> None:
        """Put the original config back between tools."""
        self.triton.load_model(self.model, self.config)

    def perfsweep_args(self) -> list[str]:
        return [
            "--model",
            self.model,
            "--url",
            f"http://{self.triton.http_url}",
            "--metrics-url",
            self.triton.metrics_url,
        ]

    def start_for_ma(self) -> dict[str, str]:
        self.reset()
        return {
            "http": self.triton.http_url,
            "grpc": self.triton.grpc_url,
            "metrics": self.triton.metrics_url,
        }

    def ma_pbtxt(self) -> str:
        return (self.triton.repository / self.model / "config.pbtxt").read_text()

    def stop_for_ma(self) -> None:
        self.reset()

    def close(self) -> None:
        self.triton.stop()


# --------------------------------------------------------------------------------------------
# One benchmark


def run_target(target_name: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    quick = args.quick
    doc = scenario_doc(target_name, quick)
    instrument = {"capacity_resolution": args.grid_resolution}
    space = doc["space"]
    keys = space_keys(space)
    target: SimTarget | TritonTarget = (
        SimTarget(workdir) if target_name == "sim" else TritonTarget(workdir)
    )
    p99_ms = float(doc["goals"]["p99_ms"])
    scenario = write_scenario(doc, workdir / "scenario.toml")
    grid_scenario = write_scenario(
        doc,
        workdir / "grid.toml",
        budget={
            "trials": len(keys),
            "time_budget_s": 3600,
            "patience": len(keys) + 1,
            "validate_top": 0,
            **instrument,
        },
    )
    tools: dict[str, dict[str, Any]] = {}
    # predict's wall time turns on how its first measurements land against the band (one
    # trial or five), so it runs several times: "predict", "predict-2", ...
    runs = [
        ("predict" if i == 0 else f"predict-{i + 1}", "predict") for i in range(args.predict_runs)
    ]
    try:
        for name, search in [*runs, ("tpe", "tpe")]:
            print(f"[{target_name}] perfsweep --search {search} ({name}) ...", flush=True)
            tools[name] = perfsweep_run(
                name,
                target.perfsweep_args(),
                scenario,
                search,
                workdir / name,
                args.timeout_s,
            )
            print(f"  {tools[name]['wall_s']:.1f} s -> {tools[name].get('config')}", flush=True)
            if isinstance(target, TritonTarget):
                target.reset()
        if args.before:
            print(f"[{target_name}] perfsweep at {args.before} (before) ...", flush=True)
            before = Before(args.before, workdir)
            tools["before"] = perfsweep_run(
                "before",
                target.perfsweep_args(),
                write_scenario(before.scenario_doc(target_name, quick), workdir / "before.toml"),
                None,
                workdir / "before",
                args.timeout_s,
                before=before,
            )
            print(f"  {tools['before']['wall_s']:.1f} s -> {tools['before'].get('config')}")
            if isinstance(target, TritonTarget):
                target.reset()
        if not args.no_ma:
            print(f"[{target_name}] Model Analyzer quick ...", flush=True)
            started = time.perf_counter()
            try:
                endpoints = target.start_for_ma()
                server_s = time.perf_counter() - started
                tools["ma"] = ma_run(
                    workdir / "ma",
                    **endpoints,
                    model=target.model,
                    pbtxt=target.ma_pbtxt(),
                    space=space,
                    p99_ms=p99_ms,
                    timeout_s=args.timeout_s,
                )
                tools["ma"]["server_start_s"] = server_s
                tools["ma"]["wall_s"] += server_s
            except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
                tools["ma"] = {"tool": "ma", "error": f"{type(exc).__name__}: {exc}"}
            finally:
                target.stop_for_ma()
            print(f"  {tools['ma'].get('wall_s', 0):.1f} s -> {tools['ma'].get('config')}")
        grids = []
        for repeat in range(args.grid_repeats):
            print(
                f"[{target_name}] grid {repeat + 1}/{args.grid_repeats} ({len(keys)} configs) ..."
            )
            grids.append(
                perfsweep_run(
                    "grid",
                    target.perfsweep_args(),
                    grid_scenario,
                    "grid",
                    workdir / f"grid-{repeat}",
                    7200,
                )
            )
            print(f"  {grids[-1]['wall_s']:.1f} s", flush=True)
        grid, capacities, bracketed, repeats = combine_grids(grids)
        # Recommendations outside the space: the same instrument on a one-config grid.
        for name, tool in tools.items():
            config = tool.get("config")
            if config is None or config_key(config) in capacities:
                continue
            key = config_key(config)
            print(f"[{target_name}] measuring {name}'s {key} (outside the grid) ...", flush=True)
            one = {
                "max_batch_size": [key[0], key[0]],
                "max_queue_delay_us": [key[1], key[1]],
                "delay_steps": 1,
                "preferred_batch_size": list(key[2]) if key[2] else "none",
                "instance_count": [key[3], key[3]],
            }
            extra = perfsweep_run(
                f"extra-{name}",
                target.perfsweep_args(),
                write_scenario(
                    {**doc, "space": one},
                    workdir / f"extra-{name}.toml",
                    budget={"trials": 1, "validate_top": 0, "time_budget_s": 600, **instrument},
                ),
                "grid",
                workdir / f"extra-{name}",
                1200,
            )
            for m in extra.get("measured", []):
                if config_key(m["config"]) == key and m["capacity_rps"] is not None:
                    capacities[key] = m["capacity_rps"]
            tool["measured_outside_grid"] = True
    finally:
        target.close()

    result = summarise(
        target_name, p99_ms, space, keys, tools, grid, capacities, bracketed, workdir
    )
    result["grid"]["repeats"] = len(grids)
    result["grid"]["resolution"] = args.grid_resolution
    # Between runs only: one run can measure a config twice (the model's own config is the
    # baseline and a grid point), which says nothing about run-to-run noise.
    result["grid"]["noise"] = grid_noise(repeats) if len(grids) > 1 else None
    return result


def combine_grids(
    grids: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, Any], dict[Key, float], dict[Key, bool], dict[Key, list[float]]]:
    """One instrument from several grid runs: each config's median capacity (bracketed only if
    every run bracketed it), the runs' total wall time, and each config's capacities."""
    repeats: dict[Key, list[float]] = {}
    bracketed: dict[Key, bool] = {}
    for run in grids:
        for m in run.get("measured", []):
            key = config_key(m["config"])
            bracketed[key] = bracketed.get(key, True) and bool(m["bracketed"])
            if m["capacity_rps"] is not None:
                repeats.setdefault(key, []).append(m["capacity_rps"])
    capacities = {k: statistics.median(v) for k, v in repeats.items()}
    grid = {
        "wall_s": sum(g["wall_s"] for g in grids),
        "exit_code": max((g["exit_code"] for g in grids), default=0),
        "error": next((g.get("error") for g in grids if g.get("error")), None),
    }
    return grid, capacities, bracketed, repeats


def grid_noise(repeats: Mapping[Key, Sequence[float]]) -> dict[str, Any] | None:
    """How much one config's capacity moves between grid runs: (max - min) / median per config
    measured more than once; the floor under any prediction error read against this grid."""
    spreads = [
        (max(v) - min(v)) / statistics.median(v)
        for v in repeats.values()
        if len(v) > 1 and statistics.median(v) > 0
    ]
    if not spreads:
        return None
    return {
        "configs": len(spreads),
        "median_spread": round(statistics.median(spreads), 4),
        "max_spread": round(max(spreads), 4),
    }


def summarise(
    target_name: str,
    p99_ms: float,
    space: Mapping[str, Any],
    keys: Sequence[Key],
    tools: dict[str, dict[str, Any]],
    grid: Mapping[str, Any],
    capacities: Mapping[Key, float],
    bracketed: Mapping[Key, bool],
    workdir: Path,
) -> dict[str, Any]:
    """Quality of each tool's recommendation and the predict search's prediction error."""
    best_key = max(keys, key=lambda k: capacities.get(k, -1.0))
    for tool in tools.values():
        config = tool.get("config")
        tool["quality"] = (
            quality(capacities, keys, config_key(config)) if config is not None else None
        )
        tool["capacity_rps"] = capacities.get(config_key(config)) if config else None

    # Prediction error of the predict search's simulator.
    pred = predictions(Path(tools["predict"].get("run_dir", workdir / "predict")))
    own = [
        (m["prediction_rps"], m["capacity_rps"])
        for m in tools["predict"].get("measured", [])
        if m["prediction_rps"] is not None and m["capacity_rps"] is not None and m["bracketed"]
    ]
    over_grid = [
        (pred[k], capacities[k])
        for k in keys
        if k in pred and k in capacities and bracketed.get(k, True)
    ]
    misses: list[dict[str, Any]] = [
        {
            "config": list(k),
            "predicted_rps": pred[k],
            "measured_rps": capacities[k],
            "error": abs(pred[k] - capacities[k]) / capacities[k],
        }
        for k in keys
        if k in pred and capacities.get(k) and bracketed.get(k, True)
    ]
    worst = sorted(misses, key=lambda w: -w["error"])[:5]
    return {
        "predict_runs": predict_runs(tools),
        "target": target_name,
        "p99_ms": p99_ms,
        "space": space,
        "space_size": len(keys),
        "tools": tools,
        "grid": {
            "wall_s": grid["wall_s"],
            "exit_code": grid["exit_code"],
            "best_config": list(best_key),
            "best_capacity_rps": capacities.get(best_key),
            "capacities": [
                {
                    "config": list(k),
                    "capacity_rps": capacities.get(k),
                    "bracketed": bracketed.get(k),
                }
                for k in keys
            ],
            "error": grid.get("error"),
        },
        "prediction_error": {
            "own_trials": error_stats(relative_errors(own)),
            "grid": error_stats(relative_errors(over_grid)),
            "unbracketed_left_out": sum(1 for k in keys if bracketed.get(k) is False),
            "worst": worst,
        },
    }


def predict_runs(tools: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The predict runs together: median, lowest and highest wall time, each over Model
    Analyzer's and tpe's, the lowest quality, and the trials each measured."""
    runs = [t for name, t in tools.items() if name.split("-")[0] == "predict" and t.get("wall_s")]
    if not runs:
        return None
    walls = sorted(t["wall_s"] for t in runs)
    out: dict[str, Any] = {
        "n": len(runs),
        "wall_s": {"median": statistics.median(walls), "min": walls[0], "max": walls[-1]},
        "trials": [(t.get("trials") or {}).get("complete") for t in runs],
        "quality_min": min(
            (t["quality"] for t in runs if t.get("quality") is not None), default=None
        ),
    }
    for peer, _ in PEERS:
        peer_wall = (tools.get(peer) or {}).get("wall_s")
        if peer_wall:
            out[f"over_{peer}"] = {k: v / peer_wall for k, v in out["wall_s"].items()}
    return out


def table(result: Mapping[str, Any]) -> str:
    tools = result["tools"]
    peer_walls = [(tools.get(peer) or {}).get("wall_s") for peer, _ in PEERS]

    def fmt(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    lines = [
        f"target {result['target']}, goal p99 <= {result['p99_ms']:g} ms, "
        f"{result['space_size']} configs; grid best {result['grid']['best_config']} at "
        f"{fmt(result['grid']['best_capacity_rps'], '.1f')} req/s "
        f"(grid wall {result['grid']['wall_s']:.0f} s, capacities resolved to "
        f"{result['grid'].get('resolution', 0.2):.0%})",
        "",
        "| tool | wall (s) | "
        + "".join(f"/ {heading} | " for _, heading in PEERS)
        + "recommended (mbs, delay us, pref, inst) | capacity (req/s) | quality |",
        "|---|---|" + "---|" * len(PEERS) + "---|---|---|",
    ]
    for name, tool in tools.items():
        wall = tool.get("wall_s")
        config = tool.get("config")
        lines.append(
            f"| {name} | {fmt(wall, '.1f')} "
            + "".join(f"| {fmt(wall / pw if wall and pw else None, '.2f')} " for pw in peer_walls)
            + f"| {config_key(config) if config else tool.get('error', '-')[:60]!s} "
            f"| {fmt(tool.get('capacity_rps'), '.1f')} | {fmt(tool.get('quality'), '.1%')} |"
        )
    runs = result.get("predict_runs")
    if runs and runs["n"] > 1:
        w = runs["wall_s"]
        ratios = "".join(
            f", / {peer} {runs[f'over_{peer}']['median']:.2f}x "
            f"({runs[f'over_{peer}']['min']:.2f}-{runs[f'over_{peer}']['max']:.2f}x)"
            for peer, _ in PEERS
            if f"over_{peer}" in runs
        )
        lines.append(
            f"\npredict over {runs['n']} runs: wall median {w['median']:.1f} s "
            f"({w['min']:.1f}-{w['max']:.1f} s){ratios}; trials {runs['trials']}; "
            f"lowest quality {fmt(runs['quality_min'], '.1%')}"
        )
    noise = result["grid"].get("noise")
    if noise:
        lines.append(
            f"\ngrid: {result['grid']['repeats']} runs, each config's capacity their median; "
            f"spread between runs (max - min) / median: median {noise['median_spread']:.1%}, "
            f"worst {noise['max_spread']:.1%} over {noise['configs']} configs"
        )
    pe = result["prediction_error"]
    for where in ("own_trials", "grid"):
        s = pe[where]
        lines.append(
            f"\nprediction error ({where}): n={s['n']}, median {fmt(s['median'], '.1%')}, "
            f"worst {fmt(s['worst'], '.1%')}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=["sim", "triton"], default="sim")
    parser.add_argument("--quick", action="store_true", help="tiny space and budgets (smoke)")
    parser.add_argument("--no-ma", action="store_true", help="skip Model Analyzer")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per tool")
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    parser.add_argument(
        "--grid-repeats",
        type=int,
        default=1,
        help="measure the grid this many times; each config's capacity is their median, and "
        "the spread between runs is reported (the noise floor of every figure)",
    )
    parser.add_argument(
        "--before",
        default=BEFORE_COMMIT,
        help="the commit of perfsweep before sequential steps (its TPE search, fixed windows), "
        "run as the tool 'before'; '' to skip it",
    )
    parser.add_argument(
        "--grid-resolution",
        type=float,
        default=0.05,
        help="the instrument's capacity resolution (budget.capacity_resolution of the grid "
        "and of one-config runs): each capacity is the lower end of a bracket this wide",
    )
    parser.add_argument(
        "--predict-runs",
        type=int,
        default=3,
        help="run the predict search this many times (its wall time varies with how its "
        "first measurements land); the first run's predictions give the prediction error",
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if not args.no_ma and not (MA_BIN.is_file() and PERF_ANALYZER.is_file()):
        parser.error(f"Model Analyzer ({MA_BIN}) or perf_analyzer missing; pass --no-ma")

    from analyzer.rundir.results import environment

    workdir = Path(tempfile.mkdtemp(prefix="time_to_answer-"))
    try:
        started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        load_before = os.getloadavg()
        result = run_target(args.target, args, workdir)
        doc = {
            "format_version": FORMAT_VERSION,
            "kind": "perfsweep.benchmark.time_to_answer",
            "started_at": started,
            "quick": args.quick,
            "environment": environment("time_to_answer"),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "result": result,
        }
        print(table(result))
        out = args.output or (
            ROOT / "benchmarks" / "results" / f"time_to_answer-{args.target}-{started}.json"
        )
        out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"wrote {out}")
    finally:
        if args.keep:
            shutil.copytree(workdir, args.keep, dirs_exist_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if re.search(r"\bpytest\b", sys.argv[0]):  # pragma: no cover
        raise SystemExit("run this file directly, not through pytest")
    raise SystemExit(main())
