"""Child processes of ``test_netns.py``: a Locust master and workers that keep their own record.

``python -m tests.load.netns_driver master ...`` runs one open-loop level through
``LocustLoadGenerator`` as a Locust master expecting remote workers, and prints the measurement
plus the number of collections (ticks) it made as JSON on its last stdout line.

``python -m tests.load.netns_driver worker ... --out FILE`` is ``perfsweep load --worker``
(``analyzer.load.worker.run_worker``) that also keeps every latency it records, raw, in
segments cut at each tick it sends: segment k is exactly what the master's (k+1)-th collection
received from this worker. It writes them to FILE when the master quits. The test then knows
each worker's own requests independently of the master's merge.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def worker(args: argparse.Namespace) -> None:
    """A Locust worker recording raw latencies per tick segment."""
    import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
    from analyzer.load import recorder
    from analyzer.load.worker import run_worker

    segments: list[list[float]] = [[]]
    original_done = recorder.Recorder.done
    original_take = recorder.Recorder.take_tick

    def done(self: Any, latency_s: float, service_s: float, error: Any, *rest: Any) -> None:
        segments[-1].append(latency_s)
        original_done(self, latency_s, service_s, error, *rest)  # rest: the traffic class

    def take_tick(self: Any) -> dict[str, Any]:
        tick = original_take(self)
        segments.append([])  # no yield in between: the next request lands in the next segment
        return tick

    recorder.Recorder.done = done  # type: ignore[method-assign]
    recorder.Recorder.take_tick = take_tick  # type: ignore[method-assign]
    run_worker(args.master_host, args.master_port, args.index)
    Path(args.out).write_text(json.dumps({"segments": segments}))


def master(args: argparse.Namespace) -> None:
    """One open-loop level as a master of ``--workers`` remote workers."""
    from analyzer.load import EngineOptions, LocustLoadGenerator
    from analyzer.load.backends import DistributedBackend
    from analyzer.measure.arrivals import CONSTANT
    from analyzer.measure.specs import LoadMode, LoadSpec

    collected: list[int] = []
    original_collect = DistributedBackend.collect

    def collect(self: DistributedBackend) -> Any:
        tick = original_collect(self)
        collected.append(tick.completed)
        return tick

    DistributedBackend.collect = collect  # type: ignore[method-assign]
    options = EngineOptions(
        url=args.url,
        model=args.model,
        expect_remote_workers=args.workers,
        master_bind_host=args.bind,
        master_port=args.port,
        metrics_url=args.metrics_url,
    )
    spec = LoadSpec(
        LoadMode.REQUEST_RATE,
        args.rate,
        arrival=CONSTANT,
        warmup_s=0.5,
        window_s=args.window_s,
        # every window counts: the merged result is all of them, so the test can add them up
        stable_windows=args.windows,
        max_windows=args.windows,
    )
    with LocustLoadGenerator(options) as generator:
        measurement = generator.measure(spec)
    print(json.dumps({"measurement": measurement.to_dict(), "collected": collected}), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="role", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--master-host", required=True)
    w.add_argument("--master-port", type=int, required=True)
    w.add_argument("--index", type=int, default=0)
    w.add_argument("--out", required=True)
    m = sub.add_parser("master")
    m.add_argument("--bind", required=True)
    m.add_argument("--port", type=int, required=True)
    m.add_argument("--url", required=True)
    m.add_argument("--metrics-url", required=True)
    m.add_argument("--model", required=True)
    m.add_argument("--workers", type=int, default=2)
    m.add_argument("--rate", type=float, default=60.0)
    m.add_argument("--window-s", type=float, default=1.5)
    m.add_argument("--windows", type=int, default=2)
    args = parser.parse_args(argv)
    worker(args) if args.role == "worker" else master(args)


if __name__ == "__main__":
    main(sys.argv[1:])
