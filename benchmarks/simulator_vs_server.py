"""The simulator's prediction against the server's measurement, three cases.

* ``batching``: the reference server in this process (``ServerThread``) with a jitter-free
  simulated model (2 ms + 1 ms an item, max batch size 8, 2 ms queue delay, one instance); a
  seeded open-loop Poisson client sends batch-1 requests over gRPC at 300 req/s for 4 s. The
  server's batch-size histogram (its statistics extension's ``batch_stats``) against the
  simulator's at the same rate and config, on the execution times the server's statistics
  measured in that run (the model's profile TOML for sizes it ran fewer than 20 times): the
  batcher is compared, not this machine's sleep overshoot. Claims: the histograms'
  total-variation distance at most 0.15, and the server's mean batch size from 15 % below the
  simulator's to 25 % above (a batcher timer that fires late and a client that bunches its
  sends only ever make batches larger; 15 % below still catches a batcher that ignores the
  queue delay, 25 % above one that waits twice as long).
* ``shapes``: requests of two shapes that may not share a batch. The model's one FP32 ``[-1]``
  input has no ``allow_ragged_batch``, so the server (as Triton) batches requests of equal shape
  only; the client sends lengths 16 and 17 half and half (5 ms queue delay). The simulator runs
  the same load as a request mix of two kinds with different batching keys. Claims: distance
  at most 0.15, mean batch sizes within 15 %, and the simulator with the two shapes sharing
  batches (an unkeyed mix) over 1.3x the server's mean batch.
* ``lengths``: predict-then-verify on a real Triton 2.51 (the ``tritonserver`` of the
  nvidia-pytriton wheel) with a text classifier fed sentences of mixed length: two INT64 ``[-1]``
  inputs with ragged batching, ``6 ms + 0.02 ms * rows * longest sequence`` per batch, as a
  transformer pads a batch to its longest member; the load a perf_analyzer data file of 40
  sentences of 12 to 300 tokens. A sweep with ``--search predict`` profiles it with that data,
  predicts every config of a small space (8 configs) and measures the predicted best first; a
  second one, whose space is one config (max batch size 2), measures a config the first did
  not. Claims: the predictions of the measured capacities (each baseline's forecast and each
  trial's prediction, as the sweeps recorded them before measuring) within 20 % of the
  measurements (median over the bracketed ones, at least 3), the predicted best, measured
  first, within 25 % of its own prediction, and it serves at least what the baseline serves.

Command (repository root): ``.venv/bin/python benchmarks/simulator_vs_server.py`` (``--case
batching|shapes|lengths|all``, default ``all``; ~10 s each for the first two, ~2 min for
``lengths``). Prints a markdown table per case and writes
``benchmarks/results/simulator_vs_server-<UTC>.json`` (``format_version`` 1): each case's
figures and ``claims``, each claim's text mapped to whether it held. Loopback only; every
server it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from analyzer.predict.profile import RequestKind, RequestMix  # noqa: E402
from analyzer.predict.sim_records import SimConfig  # noqa: E402
from analyzer.predict.simulator import simulate  # noqa: E402
from analyzer.predict.sources import from_statistics, from_toml  # noqa: E402
from analyzer.rundir import records  # noqa: E402
from analyzer.rundir.results import RunDirectory  # noqa: E402
from benchmarks.record import run_recorded  # noqa: E402
from tests.support import batch_histograms as hist  # noqa: E402
from tests.support.real_triton import (  # noqa: E402
    RealTriton,
    TritonInstall,
    TritonUnavailable,
)
from tests.support.servers import write_sim_model  # noqa: E402
from tests.support.sweeps import CLI  # noqa: E402
from tests.support.text_model import (  # noqa: E402
    padded_sequence_model,
    sentence_lengths,
    write_data_file,
)
from tests.support.traffic import fp32_bodies, open_loop_grpc  # noqa: E402

FORMAT_VERSION = 1

CASES = ("batching", "shapes", "lengths")

#: ``batching`` and ``shapes``: the open-loop client's rate and duration, and how many requests
#: the simulator draws.
RATE_RPS = 300.0
DURATION_S = 4.0
SIM_REQUESTS = 20000
#: A size the server ran at least this often has its measured execution time in the profile.
MIN_EXECUTIONS = 20
#: The histograms' largest total-variation distance; the server's mean batch over the
#: simulator's: the bounds of ``batching`` and the relative tolerance of ``shapes``.
MAX_TV = 0.15
BATCHING_MEAN_RATIO = (0.85, 1.25)
SHAPES_MEAN_TOLERANCE = 0.15
#: ``shapes``: an unkeyed mix's mean batch over the server's is above this.
UNKEYED_OVER = 1.3

BATCHING_CONFIG = SimConfig(max_batch_size=8, max_queue_delay_us=2000, instance_count=1)
SHAPES_CONFIG = SimConfig(max_batch_size=8, max_queue_delay_us=5000, instance_count=1)
LENGTHS = (16, 17)

#: ``lengths``: the model, and the bounds of the prediction error.
TEXT_MODEL = "textcls_mix"
MAX_MEDIAN_ERROR = 0.20
MAX_FIRST_ERROR = 0.25
MIN_POINTS = 3


# --------------------------------------------------------------------------------------------
# batching and shapes: the reference server in this process


def serve_and_send(
    repo: Path, model: str, bodies: Sequence[list[Any]], seed: int
) -> dict[str, Any]:
    """The reference server in this process on ``repo`` (``model`` only), and the open-loop
    client sending ``bodies`` at :data:`RATE_RPS` for :data:`DURATION_S`: the model's statistics
    before and after, and how many requests were sent."""
    from reference_server.app import ServerOptions, ServerThread

    options = ServerOptions(
        model_repositories=(repo,), models=(model,), device="cpu", delay_scheduler=0
    )
    server = ServerThread(options).start()
    try:
        before = server.core.model_statistics(model)
        sent = open_loop_grpc(server.grpc_url, model, bodies, RATE_RPS, DURATION_S, seed)
        after = server.core.model_statistics(model)
    finally:
        server.stop()
    return {"before": before, "after": after, "sent": sent}


def dynamic_batching(config: SimConfig) -> str:
    return f"dynamic_batching {{ max_queue_delay_microseconds: {config.max_queue_delay_us} }}"


def observed_timings(stats: Mapping[str, Any], model: str) -> dict[int, Any]:
    """The execution times the server had in the run, by batch size: the sizes it ran often
    enough to trust their means."""
    profile = from_statistics(stats, model, server="reference server")
    return {t.batch_size: t for t in profile.timings if t.executions >= MIN_EXECUTIONS}


def histograms(measured: Mapping[int, int], predicted: Mapping[int, int]) -> dict[str, Any]:
    """Both histograms, their shares, distance and mean batch sizes."""
    return {
        "server": {str(b): n for b, n in sorted(measured.items())},
        "simulator": {str(b): n for b, n in sorted(predicted.items())},
        "server_shares": {str(b): round(s, 4) for b, s in sorted(hist.shares(measured).items())},
        "simulator_shares": {
            str(b): round(s, 4) for b, s in sorted(hist.shares(predicted).items())
        },
        "tv_distance": round(hist.tv_distance(measured, predicted), 4),
        "server_mean_batch": round(hist.mean_batch(measured), 3),
        "simulator_mean_batch": round(hist.mean_batch(predicted), 3),
        "mean_batch_ratio": round(hist.mean_batch(measured) / hist.mean_batch(predicted), 3),
    }


def run_batching(work: Path) -> dict[str, Any]:
    config = BATCHING_CONFIG
    model_dir = write_sim_model(
        work / "repo",
        "simlin",
        device_ms=2.0,
        per_item_ms=1.0,
        max_batch_size=config.max_batch_size,
        instances=config.instance_count,
        dynamic_batching=dynamic_batching(config),
    )
    run = serve_and_send(work / "repo", "simlin", fp32_bodies(16), seed=11)
    before = run["before"]["model_stats"][0]
    measured = hist.batch_counts(run["after"]["model_stats"][0])
    observed = observed_timings(run["after"], "simlin")
    # Each often-run size's execution time against the configured one: a sleep never ends
    # early but overshoots by what the OS scheduler adds (0.6 ms seen on a busy 2-core
    # machine), hence the one-sided bound.
    timings = [
        {
            "batch_size": b,
            "executions": t.executions,
            "configured_ms": 2.0 + 1.0 * b,
            "measured_ms": round(t.infer_ms, 3),
            "within": (2.0 + 1.0 * b) - 0.05 <= t.infer_ms <= (2.0 + 1.0 * b) * 1.3 + 0.5,
        }
        for b, t in sorted(observed.items())
    ]
    planted = from_toml(model_dir / "profile.toml", max_batch_size=config.max_batch_size)
    profile = replace(
        planted, timings=tuple(observed.get(t.batch_size, t) for t in planted.timings)
    )
    predicted = simulate(profile, config, RATE_RPS, requests=SIM_REQUESTS, seed=1).batch_sizes
    figures = histograms(measured, predicted)
    low, high = BATCHING_MEAN_RATIO
    return {
        "server": "reference (in process), simulated model, device cpu",
        "model": {"device_ms": [2.0, 1.0], "config": config.describe()},
        "rate_rps": RATE_RPS,
        "duration_s": DURATION_S,
        "sent": run["sent"],
        "timings": timings,
        **figures,
        "claims": {
            f"tv_distance <= {MAX_TV:g}": hist.tv_distance(measured, predicted) <= MAX_TV,
            f"{low:g} <= server / simulator mean batch <= {high:g}": (
                low <= hist.mean_batch(measured) / hist.mean_batch(predicted) <= high
            ),
            "a fresh server: no batch before the load": not before.get("batch_stats"),
            "the server's batch statistics count every request sent": (
                sum(b * n for b, n in measured.items()) == run["sent"]
            ),
            "each often-run size within [configured - 0.05, 1.3 x configured + 0.5] ms": all(
                t["within"] for t in timings
            ),
        },
    }


def run_shapes(work: Path) -> dict[str, Any]:
    config = SHAPES_CONFIG
    model_dir = write_sim_model(
        work / "repo",
        "simvar",
        device_ms=2.0,
        per_item_ms=1.0,
        max_batch_size=config.max_batch_size,
        dynamic_batching=dynamic_batching(config),
    )
    pbtxt = model_dir / "config.pbtxt"
    pbtxt.write_text(pbtxt.read_text().replace("dims: [ 16 ]", "dims: [ -1 ]"))
    run = serve_and_send(work / "repo", "simvar", fp32_bodies(*LENGTHS), seed=5)
    measured = hist.batch_counts(run["after"]["model_stats"][0])
    observed = observed_timings(run["after"], "simvar")
    planted = from_toml(model_dir / "profile.toml", max_batch_size=config.max_batch_size)
    timings = tuple(observed.get(t.batch_size, t) for t in planted.timings)
    keyed = RequestMix("elements", tuple(RequestKind(n, 0.5, k) for k, n in enumerate(LENGTHS)))
    profile = replace(planted, timings=timings, mix=keyed)
    predicted = simulate(profile, config, RATE_RPS, requests=SIM_REQUESTS, seed=1).batch_sizes
    # The simulator letting the two shapes share batches, as an unkeyed mix would.
    mixed = replace(keyed, kinds=tuple(replace(k, key=None) for k in keyed.kinds))
    unkeyed = simulate(
        replace(profile, mix=mixed), config, RATE_RPS, requests=SIM_REQUESTS, seed=1
    ).batch_sizes
    figures = histograms(measured, predicted)
    server_mean, sim_mean = hist.mean_batch(measured), hist.mean_batch(predicted)
    return {
        "server": "reference (in process), simulated model, device cpu",
        "model": {"device_ms": [2.0, 1.0], "config": config.describe(), "lengths": LENGTHS},
        "rate_rps": RATE_RPS,
        "duration_s": DURATION_S,
        "sent": run["sent"],
        **figures,
        "unkeyed_mean_batch": round(hist.mean_batch(unkeyed), 3),
        "claims": {
            f"tv_distance <= {MAX_TV:g}": hist.tv_distance(measured, predicted) <= MAX_TV,
            f"server mean batch within {100 * SHAPES_MEAN_TOLERANCE:g} % of the simulator's": (
                abs(server_mean - sim_mean) <= SHAPES_MEAN_TOLERANCE * sim_mean
            ),
            f"unkeyed mean batch > {UNKEYED_OVER:g} x the server's": (
                hist.mean_batch(unkeyed) > UNKEYED_OVER * server_mean
            ),
            "the server's batch statistics count every request sent": (
                sum(b * n for b, n in measured.items()) == run["sent"]
            ),
        },
    }


# --------------------------------------------------------------------------------------------
# lengths: predict-then-verify on a real Triton

LENGTHS_SCENARIO = """
objective = "throughput"
[model]
name = "{model}"
[input]
data_file = "{data}"
[traffic]
min_rate_rps = 10.0
start_rps = 40.0
max_rate_rps = 600.0
[goals]
p99_ms = 200.0
max_error_rate = 0.01
[space]
max_batch_size = {mbs}
max_queue_delay_us = {delay}
delay_steps = {delay_steps}
preferred_batch_size = "none"
instance_count = [1, 1]
[budget]
trials = {trials}
warmup_s = 0.5
window_s = 0.5
min_requests = 60
capacity_resolution = 0.1
validate_top = 0
[search]
strategy = "predict"
profile_time_s = 30.0
"""

#: The first sweep's space (8 configs; its predicted best is at max batch size 4 or 8), and
#: the second's one config.
WIDE = {"mbs": [1, 8], "delay": [0, 2000], "delay_steps": 2, "trials": 3}
NARROW = {"mbs": [2, 2], "delay": [0, 0], "delay_steps": 1, "trials": 1}


def predict_sweep(url: str, work: Path, name: str, space: Mapping[str, object]) -> Path:
    """One ``perfsweep run --url --search predict`` of the text model with the sentences: its
    run directory (exit 1, no config meeting the goals, is a result)."""
    scenario = work / f"{name}.toml"
    scenario.write_text(
        LENGTHS_SCENARIO.format(model=TEXT_MODEL, data=work / "sentences.json", **space)
    )
    run_dir = work / name
    done = subprocess.run(
        [
            *CLI,
            *("run", "--scenario", str(scenario), "--url", f"http://{url}"),
            *("--run-dir", str(run_dir), "--no-report"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"perfsweep run failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return run_dir


def run_lengths(work: Path, install: TritonInstall) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    write_data_file(work / "sentences.json", sentence_lengths())
    config, source = padded_sequence_model(TEXT_MODEL, base_ms=6.0, per_token_ms=0.02)
    with RealTriton(install, work / "triton") as triton:
        triton.add_model(config, model_source=source)
        triton.load_model(TEXT_MODEL)
        runs = {
            name: predict_sweep(triton.http_url, work, name, space)
            for name, space in (("wide", WIDE), ("narrow", NARROW))
        }
    summaries = {name: json.loads((run / "summary.json").read_text()) for name, run in runs.items()}
    profile = json.loads((runs["wide"] / "profile.json").read_text())
    points: list[dict[str, Any]] = []
    measured: dict[tuple[str, int], float] = {}
    for name, run in runs.items():
        for path in RunDirectory(run).trial_paths():
            record = records.load_trial(path)
            capacity = record.measurement.capacity if record.measurement is not None else None
            if not record.complete or capacity is None:
                continue
            measured[(name, record.number)] = capacity.capacity_rps
            if record.prediction is None:
                continue
            predicted, meas = record.prediction.capacity_rps, capacity.capacity_rps
            points.append(
                {
                    "run": name,
                    "trial": record.number,
                    "config": record.config.label(),
                    "predicted_rps": predicted,
                    "measured_rps": meas,
                    "bracketed": bool(capacity.bracketed) and meas > 0,
                    "error": (predicted - meas) / meas if meas > 0 else None,
                }
            )
    errors = [abs(p["error"]) for p in points if p["bracketed"] and p["error"] is not None]
    median = statistics.median(errors) if errors else None
    baseline, first = measured.get(("wide", -1)), measured.get(("wide", 0))
    predicted_first = next(
        (p["predicted_rps"] for p in points if (p["run"], p["trial"]) == ("wide", 0)), None
    )
    first_error = (
        abs(predicted_first - first) / first if predicted_first is not None and first else None
    )
    return {
        "server": "triton 2.51 (nvidia-pytriton), Python backend",
        "model": {"base_ms": 6.0, "per_token_ms": 0.02, "sentences": 40, "tokens": [12, 300]},
        "search_strategy": {n: s.get("search_strategy") for n, s in summaries.items()},
        "search_note": {n: s.get("search_note") for n, s in summaries.items()},
        "profile_sizes": [c["size"] for c in profile.get("size_classes", [])],
        "profile_kinds": len(profile.get("mix", {}).get("kinds", [])),
        "profile_items": profile.get("mix", {}).get("items"),
        "points": points,
        "errors_counted": len(errors),
        "median_error": None if median is None else round(median, 4),
        "baseline_rps": baseline,
        "first_rps": first,
        "first_predicted_rps": predicted_first,
        "first_error": None if first_error is None else round(first_error, 4),
        "claims": {
            f"at least {MIN_POINTS} bracketed measurements": len(errors) >= MIN_POINTS,
            f"median |error| <= {100 * MAX_MEDIAN_ERROR:g} %": (
                median is not None and median <= MAX_MEDIAN_ERROR
            ),
            "the first measured config serves >= the baseline": (
                baseline is not None and first is not None and first >= baseline
            ),
            f"the first measured config within {100 * MAX_FIRST_ERROR:g} % of its prediction": (
                first_error is not None and first_error <= MAX_FIRST_ERROR
            ),
        },
    }


# --------------------------------------------------------------------------------------------
# One run


def run(cases: Sequence[str], work: Path, install: TritonInstall | None) -> dict[str, Any]:
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "batching": lambda: run_batching(work / "batching"),
        "shapes": lambda: run_shapes(work / "shapes"),
    }
    if install is not None:
        runners["lengths"] = lambda: run_lengths(work / "lengths", install)
    return {"cases": {name: runners[name]() for name in cases}}


def _claims(claims: Mapping[str, bool]) -> list[str]:
    return [f"- {text}: **{'held' if held else 'did not hold'}**" for text, held in claims.items()]


def _histogram_table(case: Mapping[str, Any]) -> list[str]:
    sizes = sorted({*case["server_shares"], *case["simulator_shares"]}, key=lambda s: int(s))
    rows = [
        "| batch size | " + " | ".join(sizes) + " | mean |",
        "|---|" + "---|" * (len(sizes) + 1),
    ]
    for side in ("server", "simulator"):
        cells = " | ".join(f"{case[f'{side}_shares'].get(s, 0.0):.2f}" for s in sizes)
        rows.append(f"| {side} | {cells} | {case[f'{side}_mean_batch']:.2f} |")
    return rows


def table(result: Mapping[str, Any]) -> str:
    out: list[str] = []
    for name in ("batching", "shapes"):
        case = result["cases"].get(name)
        if case:
            out += [f"### {name}: shares of executions, {case['sent']} requests sent", ""]
            out += _histogram_table(case)
            extra = (
                f", unkeyed mean batch {case['unkeyed_mean_batch']:.2f}"
                if "unkeyed_mean_batch" in case
                else ""
            )
            out += [
                "",
                f"TV distance {case['tv_distance']:.3f}, mean batch server / simulator "
                f"{case['mean_batch_ratio']:.3f}{extra}",
                "",
                *_claims(case["claims"]),
                "",
            ]
    case = result["cases"].get("lengths")
    if case:
        out += [
            "### lengths: capacity predicted vs measured (real Triton)",
            "",
            "| run | trial | config | predicted (req/s) | measured (req/s) | error |",
            "|---|---|---|---|---|---|",
        ]
        for p in case["points"]:
            err = "" if p["error"] is None else f"{100 * p['error']:+.1f} %"
            mark = "" if p["bracketed"] else " (not bracketed)"
            out.append(
                f"| {p['run']} | {p['trial']} | {p['config']} | {p['predicted_rps']:.1f} "
                f"| {p['measured_rps']:.1f} | {err}{mark} |"
            )
        median = case["median_error"]
        out += [
            "",
            f"median |error| {'-' if median is None else f'{100 * median:.1f} %'} over "
            f"{case['errors_counted']} measurements; baseline {case['baseline_rps']} req/s, "
            f"first measured config {case['first_rps']} req/s",
            "",
            *_claims(case["claims"]),
        ]
    return "\n".join(out).rstrip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--case",
        choices=(*CASES, "all"),
        default="all",
        help="batching, shapes (the reference server), lengths (a real Triton) or all (default)",
    )
    parser.add_argument("--output", type=Path)
    parser.add_argument("--keep", type=Path, help="copy the work directory here")
    args = parser.parse_args()
    cases = CASES if args.case == "all" else (args.case,)
    install = None
    if "lengths" in cases:
        try:
            install = TritonInstall.locate()
        except TritonUnavailable as exc:
            print(f"--case {args.case} needs the real Triton: {exc}", file=sys.stderr)
            return 2
    return run_recorded(
        "simulator_vs_server",
        FORMAT_VERSION,
        lambda work: run(cases, work, install),
        table,
        output=args.output,
        keep=args.keep,
    )


if __name__ == "__main__":
    if re.search(r"\bpytest\b", sys.argv[0]):  # pragma: no cover
        raise SystemExit("run this file directly, not through pytest")
    raise SystemExit(main())
