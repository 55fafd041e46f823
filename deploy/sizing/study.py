"""How many parallel sweep workers one PostgreSQL study takes: Optuna ask/tell latency with N
processes sharing one study in a real, local PostgreSQL.

Starts a throwaway PostgreSQL cluster on a loopback port (initdb + pg_ctl, as
tests/sweep/test_postgres.py does), then for each N runs N processes that each open the study
with perfsweep's own ``analyzer.search.study.Search`` (TPE with constant liar, the space of
deploy/k8s/components/sweep/scenario.toml) and do ``--trials`` ask/tell rounds with no
measurement in between (a trial that takes no time: the worst case for the storage). It prints,
per N, the median and p90 ask and tell latency and the study's aggregate trials per second.

    .venv/bin/python deploy/sizing/study.py [--workers 1,2,4,8] [--trials 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCENARIO = Path(__file__).resolve().parents[1] / "k8s" / "components" / "sweep" / "scenario.toml"


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextmanager
def postgres() -> Iterator[str]:
    """A throwaway cluster with trust auth on a free loopback port; yields its URL."""
    initdb = shutil.which("initdb")
    if initdb is None:
        versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        initdb = str(versions[-1]) if versions else None
    if initdb is None:
        raise SystemExit("PostgreSQL binaries not found: apt-get install postgresql")
    bindir = Path(initdb).parent
    root = Path(tempfile.mkdtemp(prefix="perfsweep-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = root / "data"
    subprocess.run(
        _as_postgres([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
        check=True,
        capture_output=True,
    )
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c max_connections=200"
    pg_ctl = str(bindir / "pg_ctl")
    subprocess.run(
        _as_postgres(
            [pg_ctl, "-D", str(data), "-o", options, "-w", "-l", str(root / "log"), "start"]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]), capture_output=True
        )
        shutil.rmtree(root, ignore_errors=True)


def _worker(url: str, study: str, seed: int, trials: int, barrier: Any, out: Any) -> None:
    from analyzer.config.scenario import load_scenario
    from analyzer.search.study import Search, TrialOutcome
    from analyzer.sweep.loop import space_for

    search = Search(space_for(load_scenario(SCENARIO, env={})), ["maximize"], url, study, seed=seed)
    barrier.wait()
    asks, tells = [], []
    for _ in range(trials):
        t0 = time.perf_counter()
        asked = search.ask()
        t1 = time.perf_counter()
        value = float(
            sum(asked.params.values())
        )  # any planted value: the sampler's cost is measured
        search.tell(asked.number, TrialOutcome((value,), {"p99_slack": -0.1, "err_slack": -0.01}))
        t2 = time.perf_counter()
        asks.append(1000 * (t1 - t0))
        tells.append(1000 * (t2 - t1))
    out.put({"ask_ms": asks, "tell_ms": tells})


def run(url: str, n: int, trials: int) -> dict[str, Any]:
    """N processes, one study, ``trials`` ask/tell rounds each."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(n + 1), ctx.Queue()
    study = f"sizing-{n}-{time.time_ns()}"
    procs = [
        ctx.Process(target=_worker, args=(url, study, seed, trials, barrier, out))
        for seed in range(n)
    ]
    # The first process creates the study and its schema; the others then open it.
    procs[0].start()
    for p in procs[1:]:
        time.sleep(0.2)
        p.start()
    barrier.wait(timeout=120)
    started = time.perf_counter()
    results = [out.get(timeout=300) for _ in procs]
    wall = time.perf_counter() - started
    for p in procs:
        p.join(timeout=60)
    asks = sorted(x for r in results for x in r["ask_ms"])
    tells = sorted(x for r in results for x in r["tell_ms"])

    def q(values: list[float], f: float) -> float:
        return round(values[min(int(f * len(values)), len(values) - 1)], 1)

    return {
        "workers": n,
        "trials": n * trials,
        "ask_p50_ms": round(statistics.median(asks), 1),
        "ask_p90_ms": q(asks, 0.9),
        "tell_p50_ms": round(statistics.median(tells), 1),
        "tell_p90_ms": q(tells, 0.9),
        "trials_per_s": round(n * trials / wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--trials", type=int, default=20, help="ask/tell rounds per worker")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with postgres() as url:
        for n in (int(x) for x in args.workers.split(",")):
            rows.append(run(url, n, args.trials))
            print(json.dumps(rows[-1]), flush=True)
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
