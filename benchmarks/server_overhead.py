"""Server overhead: the reference server against the real Triton, same client, one run.

Both servers serve the same FP32 identity model (``INPUT0`` 1x16, ``max_batch_size`` 8, dynamic
batching with ``max_queue_delay_microseconds: 100``, one CPU instance): Triton 2.51 through its
Python backend (the ``nvidia-pytriton`` wheel), the reference server through its built-in
``identity`` backend, each as its own process on 127.0.0.1. The client is one process of gevent
greenlets, each looping ``tritonclient.http`` ``infer`` (binary tensors) for a fixed duration;
levels alternate between the servers so that slow drift of the machine hits both alike.

Goal: reference throughput >= 1.0x Triton's at concurrency 32, and reference p50 <=
Triton's at concurrency 1.

Usage (from the repository root)::

    .venv/bin/python benchmarks/server_overhead.py                 # 5 s per level, c = 1 8 32
    .venv/bin/python benchmarks/server_overhead.py --duration-s 2 --concurrency 1 32

Prints a markdown table and writes ``benchmarks/results/server_overhead-<UTC time>.json``.
Exit status 0 whether or not the goal is met (``--check`` makes a missed goal exit 1).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import gevent
import numpy as np
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.real_triton import (  # noqa: E402  (needs the repository root on sys.path)
    RealTriton,
    TritonInstall,
    TritonUnavailable,
    identity_model_config,
)
from tests.support.servers import ReferenceProcess  # noqa: E402

FORMAT_VERSION = 1
MODEL = "identity"
QUEUE_DELAY_US = 100


@dataclass(frozen=True)
class LevelResult:
    """One server at one concurrency.

    Attributes:
        server: ``"reference"`` or ``"triton"``.
        concurrency: number of greenlets, each with one request in flight.
        requests: successful requests completed in the measured window.
        errors: failed requests in the measured window.
        duration_s: first request start to last completion.
        throughput_rps: ``requests / duration_s``.
        p50_ms: median latency.
        p99_ms: 99th percentile latency.
        mean_ms: mean latency; ``mean_ms * 1000 - server_request_us`` is the time outside the
            server's core (frontend, network, client), comparable between the two servers.
        mean_batch_size: server-side ``inference_count / execution_count`` delta.
        server_request_us: server-side mean request duration (statistics ``success``): core
            receipt to response handed back; client latency minus this is frontend + network.
        server_queue_us: server-side mean queue time (``queue``).
        server_compute_us: server-side mean ``compute_input + compute_infer + compute_output``.
        server_cpu_us: CPU time (user + system) of the server's processes per request, including
            Triton's Python-backend stub processes.
        context_switches: context switches of all server threads per request.
    """

    server: str
    concurrency: int
    requests: int
    errors: int
    duration_s: float
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    mean_batch_size: float
    server_request_us: float
    server_queue_us: float
    server_compute_us: float
    server_cpu_us: float
    context_switches: float


def _process_group_usage(pgid: int) -> tuple[float, int]:
    """(CPU seconds, context switches) summed over the processes and threads of a group.

    Both servers run in their own session (process group), so this covers Triton's stub
    processes too. Linux ``/proc`` only; the benchmark needs Linux for Triton anyway.
    """
    cpu_s, switches = 0.0, 0
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:
                continue
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cpu_s += (int(fields[11]) + int(fields[12])) / ticks
            for task in os.listdir(f"/proc/{entry}/task"):
                status = Path(f"/proc/{entry}/task/{task}/status").read_text()
                switches += sum(
                    int(line.split()[1])
                    for line in status.splitlines()
                    if "ctxt_switches:" in line  # voluntary_ and nonvoluntary_
                )
        except (OSError, ValueError, IndexError):
            continue  # the process or thread went away meanwhile
    return cpu_s, switches


def _mean_us(before: dict[str, Any], after: dict[str, Any], *keys: str) -> float:
    """Mean duration per request (µs) of the statistics ``keys`` between two snapshots."""
    b, a = before["inference_stats"], after["inference_stats"]
    count = a["success"]["count"] - b["success"]["count"]
    if count <= 0:
        return 0.0
    ns = sum(a[k]["ns"] - b[k]["ns"] for k in keys)
    return round(ns / count / 1000.0, 1)


def _worker(url: str, stop_at: float, latencies: list[float], errors: list[str]) -> None:
    client = httpclient.InferenceServerClient(url, connection_timeout=30.0, network_timeout=30.0)
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(data)
    try:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            try:
                client.infer(MODEL, [tensor])
            except Exception as exc:  # count it, keep the level going
                errors.append(repr(exc))
                continue
            latencies.append(time.perf_counter() - start)
    finally:
        client.close()


def _drive(url: str, concurrency: int, duration_s: float) -> tuple[list[float], list[str], float]:
    latencies: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()
    greenlets = [
        gevent.spawn(_worker, url, start + duration_s, latencies, errors)
        for _ in range(concurrency)
    ]
    gevent.joinall(greenlets, timeout=duration_s + 60)
    return latencies, errors, time.perf_counter() - start


def measure_level(
    name: str,
    server: RealTriton | ReferenceProcess,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
) -> tuple[LevelResult, list[float]]:
    """Warm up, then measure one concurrency level on one server."""
    _drive(server.http_url, concurrency, warmup_s)
    pid = server.pid
    assert pid is not None, "the server must run in its own process group"
    before = server.model_stats(MODEL)
    cpu_before, switches_before = _process_group_usage(pid)
    latencies, errors, elapsed = _drive(server.http_url, concurrency, duration_s)
    cpu_after, switches_after = _process_group_usage(pid)
    after = server.model_stats(MODEL)
    done = max(1, len(latencies))
    executions = after["execution_count"] - before["execution_count"]
    inferences = after["inference_count"] - before["inference_count"]
    p50_ms, p99_ms = _percentiles_ms(latencies)
    result = LevelResult(
        server=name,
        concurrency=concurrency,
        requests=len(latencies),
        errors=len(errors),
        duration_s=round(elapsed, 3),
        throughput_rps=round(len(latencies) / elapsed, 1),
        p50_ms=p50_ms,
        p99_ms=p99_ms,
        mean_ms=round(float(np.mean(latencies)) * 1000.0, 3) if latencies else float("nan"),
        mean_batch_size=round(inferences / executions, 2) if executions else 0.0,
        server_request_us=_mean_us(before, after, "success"),
        server_queue_us=_mean_us(before, after, "queue"),
        server_compute_us=_mean_us(
            before, after, "compute_input", "compute_infer", "compute_output"
        ),
        server_cpu_us=round((cpu_after - cpu_before) / done * 1e6, 1),
        context_switches=round((switches_after - switches_before) / done, 1),
    )
    return result, latencies


def _percentiles_ms(latencies: Sequence[float]) -> tuple[float, float]:
    if not latencies:
        return float("nan"), float("nan")
    values = np.asarray(latencies) * 1000.0
    return round(float(np.percentile(values, 50)), 3), round(float(np.percentile(values, 99)), 3)


def _summarize(
    name: str, concurrency: int, rounds: Sequence[LevelResult], latencies: Sequence[float]
) -> LevelResult:
    """One row per server and level: median throughput of the rounds, pooled percentiles."""
    mine = [r for r in rounds if r.server == name and r.concurrency == concurrency]
    p50_ms, p99_ms = _percentiles_ms(latencies)
    return LevelResult(
        server=name,
        concurrency=concurrency,
        requests=sum(r.requests for r in mine),
        errors=sum(r.errors for r in mine),
        duration_s=round(sum(r.duration_s for r in mine), 3),
        throughput_rps=round(float(np.median([r.throughput_rps for r in mine])), 1),
        p50_ms=p50_ms,
        p99_ms=p99_ms,
        mean_ms=round(float(np.mean(latencies)) * 1000.0, 3) if latencies else float("nan"),
        mean_batch_size=round(float(np.median([r.mean_batch_size for r in mine])), 2),
        server_request_us=round(float(np.median([r.server_request_us for r in mine])), 1),
        server_queue_us=round(float(np.median([r.server_queue_us for r in mine])), 1),
        server_compute_us=round(float(np.median([r.server_compute_us for r in mine])), 1),
        server_cpu_us=round(float(np.median([r.server_cpu_us for r in mine])), 1),
        context_switches=round(float(np.median([r.context_switches for r in mine])), 1),
    )


def _environment(triton: RealTriton) -> dict[str, Any]:
    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "absent"

    status, body = triton.http_status("GET", "/v2")
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "triton_version": json.loads(body)["version"] if status == 200 else "unknown",
        "packages": {p: version(p) for p in ("tritonclient", "nvidia-pytriton", "gevent", "numpy")},
        "git_commit": commit,
        # Other work on a shared machine moves these numbers; the load says how much there was.
        "load_average_1m_at_start": round(os.getloadavg()[0], 2),
    }


def _table(results: Sequence[LevelResult], ratios: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| server | concurrency | requests | throughput (req/s) | p50 (ms) | p99 (ms) "
        "| mean (ms) | mean batch | server request (µs) | server queue (µs) "
        "| server compute (µs) | server CPU (µs/req) | ctx switches/req |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.server} | {r.concurrency} | {r.requests} | {r.throughput_rps:,.0f} | "
            f"{r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.mean_ms:.2f} | {r.mean_batch_size:.2f} | "
            f"{r.server_request_us:.0f} | {r.server_queue_us:.0f} | {r.server_compute_us:.0f} | "
            f"{r.server_cpu_us:.0f} | {r.context_switches:.1f} |"
        )
    lines += [
        "",
        "| concurrency | throughput ref/Triton | p50 ref/Triton | p99 ref/Triton |",
        "|---|---|---|---|",
    ]
    for q in ratios:
        lines.append(
            f"| {q['concurrency']} | {q['throughput']:.2f}x | {q['p50']:.2f}x | {q['p99']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured time per level")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="discarded time per level")
    parser.add_argument(
        "--rounds", type=int, default=3, help="measurements per server and level (interleaved)"
    )
    parser.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=QUEUE_DELAY_US,
        help="dynamic_batching.max_queue_delay_microseconds of both models",
    )
    parser.add_argument("--output", type=Path, default=None, help="results JSON path")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch dir (default: temp)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the goal is missed")
    args = parser.parse_args(argv)

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    output = args.output or ROOT / "benchmarks" / "results" / f"server_overhead-{stamp}.json"
    config = identity_model_config(MODEL, max_queue_delay_us=args.max_queue_delay_us)
    with tempfile.TemporaryDirectory(prefix="server_overhead-") as tmp:
        workdir = args.workdir or Path(tmp)
        try:
            install = TritonInstall.locate()
        except TritonUnavailable as exc:
            print(f"server_overhead needs the real Triton: {exc}", file=sys.stderr)
            return 2
        with (
            RealTriton(install, workdir / "triton", models=[config]) as triton,
            ReferenceProcess(workdir / "reference", models=[config]) as reference,
        ):
            environment = _environment(triton)
            servers: list[tuple[str, RealTriton | ReferenceProcess]] = [
                ("reference", reference),
                ("triton", triton),
            ]
            rounds: list[LevelResult] = []
            pooled: dict[tuple[str, int], list[float]] = {}
            for concurrency in args.concurrency:
                for round_index in range(args.rounds):
                    # Alternate who goes first so drift of a shared machine hits both alike.
                    order = servers if round_index % 2 == 0 else servers[::-1]
                    for name, server in order:
                        result, latencies = measure_level(
                            name, server, concurrency, args.duration_s, args.warmup_s
                        )
                        print(f"  round {round_index}: {result}", file=sys.stderr, flush=True)
                        rounds.append(result)
                        pooled.setdefault((name, concurrency), []).extend(latencies)

    results = [
        _summarize(name, concurrency, rounds, pooled[(name, concurrency)])
        for concurrency in args.concurrency
        for name in ("reference", "triton")
    ]
    ratios = []
    for concurrency in args.concurrency:
        ref = next(r for r in results if r.server == "reference" and r.concurrency == concurrency)
        tri = next(r for r in results if r.server == "triton" and r.concurrency == concurrency)
        ratios.append(
            {
                "concurrency": concurrency,
                "throughput": round(ref.throughput_rps / tri.throughput_rps, 3),
                "p50": round(ref.p50_ms / tri.p50_ms, 3),
                "p99": round(ref.p99_ms / tri.p99_ms, 3),
            }
        )
    goals: dict[str, Any] = {}
    by_c = {q["concurrency"]: q for q in ratios}
    if 32 in by_c:
        goals["throughput_c32_ratio_ge_1"] = by_c[32]["throughput"] >= 1.0
    if 1 in by_c:
        goals["p50_c1_ratio_le_1"] = by_c[1]["p50"] <= 1.0

    document = {
        "format_version": FORMAT_VERSION,
        "benchmark": "server_overhead",
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "measured_at": stamp,
        "environment": environment,
        "settings": {
            "model": "FP32 identity, INPUT0 [1,16], max_batch_size 8, 1 CPU instance",
            "max_queue_delay_us": args.max_queue_delay_us,
            "client": "gevent greenlets, tritonclient.http infer loop, binary tensors",
            "duration_s": args.duration_s,
            "warmup_s": args.warmup_s,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "summary": "throughput = median of rounds; p50/p99 over all rounds' latencies",
        },
        "results": [asdict(r) for r in results],
        "rounds": [asdict(r) for r in rounds],
        "ratios_reference_over_triton": ratios,
        "goals_met": goals,
    }
    environment["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=2) + "\n")
    print(_table(results, ratios))
    print(f"\ngoals: {goals}\nresults: {output}")
    return 1 if args.check and not all(goals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
