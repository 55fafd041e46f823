"""Generator cost per core: ``perfsweep load`` against ``perfsweep serve`` on loopback.

Starts the reference server with two ``identity`` models (FP32 ``[1,16]`` and ``[1,3,224,224]``),
then runs one closed-loop ``perfsweep load`` per (tensor, protocol) with a single generator
process, and prints requests per second per generator core = throughput / (generator CPU share
of one core). The server runs on the same machine, so wall-clock req/s are bounded by it; the
per-core figure is what sizes the Locust workers. Each case is one short level (about 12 s).

    .venv/bin/python deploy/sizing/generator.py [--concurrency 16] [--window-s 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

PERFSWEEP = [str(Path(sys.executable).parent / "perfsweep")]
MODELS = {"small": "1, 16", "image": "1, 3, 224, 224"}


def write_repository(root: Path) -> None:
    """Two identity models: output = input, no delay (the generator, not the model, is measured)."""
    for name, dims in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(
            textwrap.dedent(
                f"""\
                name: "{name}"
                backend: "identity"
                max_batch_size: 0
                input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
                output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
                instance_group [ {{ kind: KIND_CPU count: 2 }} ]
                """
            )
        )


def start_server(repository: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """``perfsweep serve`` on free loopback ports; returns the process and its addresses."""
    proc = subprocess.Popen(
        [
            *PERFSWEEP,
            "serve",
            "--model-repository",
            str(repository),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "ready:" in line:
            parts = dict(p.split("=", 1) for p in line.split("ready:", 1)[1].split())
            return proc, parts
    raise RuntimeError("perfsweep serve exited before it was ready")


def measure(
    addr: dict[str, str], model: str, protocol: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One closed-loop level; the first (only) result of ``perfsweep load --output``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "load.json"
        cmd = [
            *PERFSWEEP,
            "load",
            "--url",
            addr["http"],
            "--grpc-url",
            addr["grpc"],
            "--model",
            model,
            "--protocol",
            protocol,
            "--concurrency",
            str(args.concurrency),
            "--window-s",
            str(args.window_s),
            "--max-windows",
            "3",
            "--warmup-s",
            "1",
            "--metrics-url",
            f"http://{addr['metrics']}/metrics",
            "--output",
            str(out),
        ]
        print("$ perfsweep", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=False, timeout=120, stdout=subprocess.DEVNULL)
        result: dict[str, Any] = json.loads(out.read_text())["results"][0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        write_repository(repo)
        proc, addr = start_server(repo)
        try:
            for model in MODELS:
                for protocol in ("http", "grpc"):
                    r = measure(addr, model, protocol, args)
                    cpu = float(r["generator_cpu_pct"])
                    per_core = r["throughput_rps"] / (cpu / 100.0) if cpu > 0 else float("nan")
                    rows.append(
                        {
                            "model": model,
                            "protocol": protocol,
                            "throughput_rps": round(r["throughput_rps"], 1),
                            "generator_cpu_pct": round(cpu, 1),
                            "rps_per_core": round(per_core),
                            "p99_ms": round(r["p99_ms"], 2),
                            "requests": r["request_count"],
                            "valid": r["valid"],
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    doc = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_count": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
