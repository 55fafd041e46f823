"""Generator vs perf_analyzer: p50/p99 of perfsweep's open loop beside Triton's own load generator.

One server (the real Triton 2.51 of the ``nvidia-pytriton`` wheel, or ``--server reference``),
one model (Python-backend sleep model, ``--delay-ms`` per execution, ``max_batch_size`` 32,
dynamic batching with preferred [16, 32] and a 600 µs queue delay, 2 CPU instances), and at each
rate the two tools take turns A B B A (perfsweep, perf_analyzer, perf_analyzer, perfsweep), so
that drift of a shared machine hits both alike. Both offer the same Poisson schedule rate for the
same time and report the merged latencies of three 5 s windows:

* perfsweep: ``LocustLoadGenerator`` in a child process (1 s warm-up, 3 windows of
  ``--window-s``, server scraped at each window, as a sweep does), latency from the INTENDED send
  time; its service time (actual send to last byte) and send lag are reported too.
* perf_analyzer (C++): ``--request-rate-range R:R:1 --request-distribution poisson -p 5000 -r 3
  -s 999 --max-threads 16`` (synchronous HTTP calls; with the default 4 threads it could not keep
  up at 400 req/s here), latency from the ACTUAL send.

Around each run the benchmark reads the model's statistics, so each row also carries the server's
own mean request time (``success`` ns / count) and the client's share per request: mean client
latency minus the server's mean request time.

perf_analyzer is not a dependency of the project: install it in a directory of its own (see
``benchmarks/README.md``) and pass ``--perf-analyzer PATH`` or set ``PERFSWEEP_PERF_ANALYZER``.

Usage (repository root)::

    .venv/bin/python benchmarks/generator_vs_perf_analyzer.py --perf-analyzer /opt/peers/bin/perf_analyzer
    .venv/bin/python benchmarks/generator_vs_perf_analyzer.py --rates 200 --rounds 2 --http-client geventhttpclient

Prints a markdown table and writes ``benchmarks/results/generator_vs_perf_analyzer-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import mean
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FORMAT_VERSION = 1
MODEL = "bench"
ENV_VAR = "PERFSWEEP_PERF_ANALYZER"
INSTALL_HINT = f"""perf_analyzer not found. Install it outside the project (shared/notes/peers.md):
    apt-get install -y libb64-0d
    python3 -m venv /opt/peers/venv
    /opt/peers/venv/bin/pip download --no-deps -d /opt/peers/dl "tritonclient[all]==2.41.1"
    unzip /opt/peers/dl/tritonclient-2.41.1-*.whl \\
        'tritonclient-2.41.1.data/data/bin/perf_analyzer' -d /opt/peers/x
    /opt/peers/venv/bin/pip install --target /opt/peers/cudart nvidia-cuda-runtime-cu12
then run it with LD_LIBRARY_PATH=/opt/peers/cudart/nvidia/cuda_runtime/lib (a wrapper script
is simplest) and pass --perf-analyzer PATH or set {ENV_VAR}=PATH."""


# ---------------------------------------------------------------------------------------------
# perfsweep side: a child process (the engine gevent-patches the process that imports it)


def _perfsweep_child(args: dict[str, Any]) -> dict[str, Any]:
    from analyzer.load import EngineOptions, LocustLoadGenerator
    from analyzer.measure.specs import Arrival, LoadMode, LoadSpec

    spec = LoadSpec(
        LoadMode.REQUEST_RATE,
        float(args["rate"]),
        arrival=Arrival.POISSON,
        warmup_s=1.0,
        window_s=float(args["window_s"]),
        max_windows=3,
        stable_windows=3,
        stability_pct=1000.0,
        seed=int(args["seed"]),
    )
    options = EngineOptions(
        url=args["url"],
        model=MODEL,
        metrics_url=args["metrics_url"],
        http_client=args["http_client"],
        precise_timer=bool(args["precise_timer"]),
    )
    with LocustLoadGenerator(options) as generator:
        m = generator.measure(spec)
    return {
        "requests": m.request_count,
        "errors": m.error_count,
        "duration_s": round(m.duration_s, 3),
        "throughput_rps": round(m.throughput_rps, 1),
        "p50_ms": m.p50_ms,
        "p99_ms": m.p99_ms,
        "mean_ms": round(m.mean_ms, 3),
        "service_p50_ms": m.service_p50_ms,
        "service_p99_ms": m.service_p99_ms,
        "send_lag_p99_ms": m.send_lag_p99_ms,
        "generator_cpu_pct": round(m.generator_cpu_pct, 1),
        "valid": m.valid,
        "messages": list(m.messages),
    }


def run_perfsweep(
    url: str, metrics_url: str, rate: float, window_s: float, seed: int, extra: dict[str, Any]
) -> dict[str, Any]:
    """One perfsweep measurement (3 windows) in a child process."""
    payload = {
        "url": url,
        "metrics_url": metrics_url,
        "rate": rate,
        "window_s": window_s,
        "seed": seed,
        **extra,
    }
    done = subprocess.run(
        [sys.executable, __file__, "_perfsweep", json.dumps(payload)],
        capture_output=True,
        text=True,
        timeout=window_s * 3 * 4 + 60,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"perfsweep child failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# ---------------------------------------------------------------------------------------------
# perf_analyzer side


def find_perf_analyzer(flag: str | None) -> str | None:
    """The flag, else ``$PERFSWEEP_PERF_ANALYZER``, else ``perf_analyzer`` on PATH."""
    for candidate in (flag, os.environ.get(ENV_VAR)):
        if candidate:
            return candidate if Path(candidate).exists() else None
    return shutil.which("perf_analyzer")


def run_perf_analyzer(
    binary: str, url: str, rate: float, window_s: float, workdir: Path
) -> dict[str, Any]:
    """One perf_analyzer measurement: 3 time windows at ``rate`` (Poisson)."""
    out_csv = workdir / f"pa-{time.monotonic_ns()}.csv"
    args = [
        binary,
        "-m",
        MODEL,
        "-u",
        url,
        "-i",
        "http",
        "--request-rate-range",
        f"{rate:g}:{rate:g}:1",
        "--request-distribution",
        "poisson",
        "--max-threads",
        "16",
        "-p",
        str(int(window_s * 1000)),
        "-r",
        "3",
        "-s",
        "999",
        "--percentile",
        "99",
        "-f",
        str(out_csv),
    ]
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=window_s * 3 * 4 + 60)
    if done.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed ({done.returncode}):\n{done.stdout[-3000:]}")
    with out_csv.open() as f:
        row = next(csv.DictReader(f))
    text = done.stdout
    count = next(
        (int(line.split(":")[1]) for line in text.splitlines() if "Request count:" in line), 0
    )
    delayed = next((line.strip() for line in text.splitlines() if "were delayed" in line), "")
    http_us = next(
        (
            float(line.split(":")[1].split()[0])
            for line in text.splitlines()
            if "Avg HTTP time:" in line
        ),
        float("nan"),
    )
    return {
        "requests": count,
        "duration_s": round(time.monotonic() - started, 3),
        "throughput_rps": float(row["Inferences/Second"]),
        "p50_ms": float(row["p50 latency"]) / 1000.0,
        "p99_ms": float(row["p99 latency"]) / 1000.0,
        "mean_ms": http_us / 1000.0,  # "Avg HTTP time": actual send to response
        "delayed_warning": delayed,
    }


# ---------------------------------------------------------------------------------------------
# the parent


def _stats(server: Any) -> dict[str, Any]:
    stats: dict[str, Any] = server.model_stats(MODEL)
    return stats


def _server_means(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    b, a = before["inference_stats"], after["inference_stats"]
    count = a["success"]["count"] - b["success"]["count"]

    def per_request_us(*keys: str) -> float:
        ns = sum(a[k]["ns"] - b[k]["ns"] for k in keys)
        return round(ns / count / 1000.0, 1) if count > 0 else 0.0

    return {
        "server_requests": count,
        "server_request_us": per_request_us("success"),
        "server_queue_us": per_request_us("queue"),
        "server_compute_us": per_request_us("compute_input", "compute_infer", "compute_output"),
    }


def _model_config(delay_ms: float) -> Any:
    from tests.support.real_triton import dynamic_batching, sleep_model_config

    return sleep_model_config(
        MODEL,
        max_batch_size=32,
        execute_delay_ms=delay_ms,
        dynamic_batching=dynamic_batching(preferred=[16, 32], max_queue_delay_us=600),
        instance_count=2,
    )


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def _table(rows: Sequence[dict[str, Any]], summary: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| rate (req/s) | tool | requests | p50 (ms) | p99 (ms) | service p99 (ms) "
        "| send-lag p99 (ms) | server request (µs) | client share (µs/req) | gen CPU % |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ps = r["tool"] == "perfsweep"
        lines.append(
            f"| {r['rate']:g} | {r['tool']} | {r['requests']} | {r['p50_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['service_p99_ms'] if ps else '-'} "
            f"| {r['send_lag_p99_ms'] if ps else '-'} | {r['server_request_us']:.0f} "
            f"| {r['client_share_us']:.0f} | {r['generator_cpu_pct'] if ps else '-'} |"
        )
    lines += [
        "",
        "| rate (req/s) | perfsweep p99 (ms) | perf_analyzer p99 (ms) | p99 ratio | perfsweep p50 "
        "(ms) | perf_analyzer p50 (ms) | p50 ratio | goal p99 <= 1.05x |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(
            f"| {s['rate']:g} | {' and '.join(f'{v:.1f}' for v in s['perfsweep_p99_ms'])} "
            f"| {' and '.join(f'{v:.1f}' for v in s['perf_analyzer_p99_ms'])} "
            f"| {s['p99_ratio']:.2f}x "
            f"| {' and '.join(f'{v:.1f}' for v in s['perfsweep_p50_ms'])} "
            f"| {' and '.join(f'{v:.1f}' for v in s['perf_analyzer_p50_ms'])} "
            f"| {s['p50_ratio']:.2f}x | {'met' if s['goal_met'] else 'missed'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_perfsweep"]:
        print(json.dumps(_perfsweep_child(json.loads(argv[1]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--perf-analyzer", default=None, help=f"binary (or ${ENV_VAR})")
    parser.add_argument("--rates", type=float, nargs="+", default=[100.0, 200.0, 400.0])
    parser.add_argument("--rounds", type=int, default=1, help="A B B A blocks per rate")
    parser.add_argument("--window-s", type=float, default=5.0, help="each of the 3 windows")
    parser.add_argument("--delay-ms", type=float, default=8.0, help="model sleep per execution")
    parser.add_argument("--server", choices=("triton", "reference"), default="triton")
    parser.add_argument("--http-client", choices=("raw", "geventhttpclient"), default="raw")
    parser.add_argument(
        "--gevent-timer", action="store_true", help="dispatcher on gevent.sleep, not a timerfd"
    )
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)

    binary = find_perf_analyzer(args.perf_analyzer)
    if binary is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    from tests.support.real_triton import RealTriton, TritonInstall, TritonUnavailable
    from tests.support.servers import ReferenceProcess

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    output = args.output or ROOT / "benchmarks" / "results" / f"generator_vs_pa-{stamp}.json"
    extra = {"http_client": args.http_client, "precise_timer": not args.gevent_timer}
    config = _model_config(args.delay_ms)
    rows: list[dict[str, Any]] = []
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="gen_vs_pa-") as tmp:
        workdir = Path(tmp)
        server: Any
        if args.server == "triton":
            try:
                install = TritonInstall.locate()
            except TritonUnavailable as exc:
                print(f"needs the real Triton: {exc}", file=sys.stderr)
                return 2
            server = RealTriton(install, workdir / "triton", models=[config])
        else:
            server = ReferenceProcess(workdir / "reference", models=[config])
        with server:
            # warm the model (Python stubs, first batches) before anything is measured
            with contextlib.suppress(RuntimeError):
                run_perf_analyzer(binary, server.http_url, max(args.rates), 3.0, workdir)
            seed = 0
            for rate in args.rates:
                for _ in range(args.rounds):
                    for tool in ("perfsweep", "perf_analyzer", "perf_analyzer", "perfsweep"):
                        seed += 1
                        before = _stats(server)
                        if tool == "perfsweep":
                            r = run_perfsweep(
                                server.http_url,
                                server.metrics_url,
                                rate,
                                args.window_s,
                                seed,
                                extra,
                            )
                        else:
                            r = run_perf_analyzer(
                                binary, server.http_url, rate, args.window_s, workdir
                            )
                        after = _stats(server)
                        r.update(_server_means(before, after), tool=tool, rate=rate)
                        r["load_average_1m"] = round(os.getloadavg()[0], 2)
                        # client mean (perfsweep: from the intended send; perf_analyzer: its "Avg
                        # HTTP time", from the actual send) minus the server's mean request time
                        share = r["mean_ms"] * 1000.0 - r["server_request_us"]
                        r["client_share_us"] = round(share, 1)
                        rows.append(r)
                        print(
                            f"  {tool:14} {rate:5g}/s p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f}"
                            f" ms (load {r['load_average_1m']})",
                            file=sys.stderr,
                            flush=True,
                        )
            env_triton = server.http_status("GET", "/v2")
    summary = []
    for rate in args.rates:
        ps = [r for r in rows if r["rate"] == rate and r["tool"] == "perfsweep"]
        pa = [r for r in rows if r["rate"] == rate and r["tool"] == "perf_analyzer"]
        ratio99 = _ratio(mean(r["p99_ms"] for r in ps), mean(r["p99_ms"] for r in pa))
        summary.append(
            {
                "rate": rate,
                "perfsweep_p99_ms": [r["p99_ms"] for r in ps],
                "perf_analyzer_p99_ms": [r["p99_ms"] for r in pa],
                "perfsweep_p50_ms": [r["p50_ms"] for r in ps],
                "perf_analyzer_p50_ms": [r["p50_ms"] for r in pa],
                "p99_ratio": ratio99,
                "p50_ratio": _ratio(mean(r["p50_ms"] for r in ps), mean(r["p50_ms"] for r in pa)),
                "goal_met": ratio99 <= 1.05,
            }
        )
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    document = {
        "format_version": FORMAT_VERSION,
        "benchmark": "generator_vs_perf_analyzer",
        "command": " ".join([Path(__file__).name, *argv]),
        "measured_at": stamp,
        "environment": {
            "host": platform.node(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "server": args.server,
            "server_v2": env_triton[1].decode(errors="replace") if env_triton[0] == 200 else "",
            "perf_analyzer": binary,
            "git_commit": commit,
            "load_average_1m_at_start": round(load_start, 2),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "settings": {
            "model": f"Python-backend sleep {args.delay_ms:g} ms/execution, max_batch_size 32, "
            "dynamic_batching preferred [16, 32] delay 600 us, 2 CPU instances",
            "window_s": args.window_s,
            "rounds": args.rounds,
            "order": "A B B A per rate and round (A = perfsweep, B = perf_analyzer)",
            **extra,
        },
        "rows": rows,
        "summary": summary,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=2) + "\n")
    print(_table(rows, summary))
    print(f"\nresults: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
