"""How precisely the reference server's core honours max_queue_delay, and its in-process rate.

No network: requests go straight into :class:`reference_server.core.server.InferenceServer` (identity
backend, no execute delay), so the numbers are the scheduler's own cost.

1. Delay precision: single requests, one at a time, for several ``max_queue_delay_microseconds``
   values; the queue time (scheduler enqueue -> execution start) should be the delay plus a
   small, stable overshoot (thread wake-ups), well below 1 ms.
2. Throughput: N threads in a closed loop for a few seconds, with dynamic batching.

Usage (from the repository root)::

    .venv/bin/python benchmarks/core_batcher.py                  # delays 0 100 500 1000 us
    .venv/bin/python benchmarks/core_batcher.py --threads 16 --duration-s 3

Prints markdown tables; numbers vary with machine load, so compare within one run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from reference_server.core.server import CoreOptions, InferenceServer
from reference_server.core.types import InferRequest

CONFIG = """
name: "{name}"
backend: "identity"
max_batch_size: 32
input {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }}
output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }}
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
"""


def _request(model: str) -> InferRequest:
    return InferRequest(model, inputs={"INPUT0": np.zeros((1, 16), np.float32)})


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays-us", type=int, nargs="+", default=[0, 100, 500, 1000])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=3.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for delay in args.delays_us:
            (root / f"d{delay}" / "1").mkdir(parents=True)
            (root / f"d{delay}" / "config.pbtxt").write_text(
                CONFIG.format(name=f"d{delay}", delay_us=delay)
            )
        server = InferenceServer(CoreOptions(model_repositories=(root,), startup_models=("*",)))
        server.start()
        try:
            print("| max_queue_delay (us) | queue p50 (us) | queue p90 (us) | queue p99 (us) |")
            print("|---|---|---|---|")
            for delay in args.delays_us:
                queue_us = []
                for _ in range(args.samples):
                    req = _request(f"d{delay}")
                    server.infer_sync(req, timeout_s=5)
                    queue_us.append((req.compute_start_ns - req.queue_start_ns) / 1000)
                print(
                    f"| {delay} | {statistics.median(queue_us):.0f} | "
                    f"{_pct(queue_us, 0.9):.0f} | {_pct(queue_us, 0.99):.0f} |"
                )

            model = f"d{args.delays_us[-1]}"
            stop_at = time.monotonic() + args.duration_s
            counts = [0] * args.threads

            def worker(k: int) -> None:
                while time.monotonic() < stop_at:
                    server.infer_sync(_request(model), timeout_s=5)
                    counts[k] += 1

            threads = [threading.Thread(target=worker, args=(k,)) for k in range(args.threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            stats = server.model_statistics(model)["model_stats"][0]
            print()
            print("| threads | delay (us) | throughput (req/s) | mean batch |")
            print("|---|---|---|---|")
            print(
                f"| {args.threads} | {args.delays_us[-1]} | {sum(counts) / args.duration_s:,.0f} | "
                f"{stats['inference_count'] / max(1, stats['execution_count']):.1f} |"
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
