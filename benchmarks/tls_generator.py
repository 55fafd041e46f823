"""The load generator over TLS beside plain HTTP: what HTTPS costs perfsweep's own process.

One reference server (its own process, the ``identity`` model: almost no work per request) and
in front of it two nginx proxies that differ only in TLS: one terminates HTTPS with a
throwaway CA's certificate, the other listens on plain HTTP. Both check the same bearer token
and keep upstream connections alive. ``perfsweep load`` drives, one after the other and
interleaved over ``--rounds``:

* ``direct``: plain HTTP to the server (no proxy: the anchor of the others);
* ``proxy http``: plain HTTP through nginx, with the token header;
* ``proxy https``: HTTPS through nginx (``--url https:// --ssl-ca``), with the token header.

Each path gets a closed-loop level (``--concurrency``) and an open-loop ladder
(``--rates``). Read per path: requests per second per generator core in closed loop
(completed / the generator's CPU share: what one process can drive), and the highest open-loop
rate perfsweep calls valid (generator CPU <= 90 % of a core and <= 1 % of requests more than
10 ms late). ``proxy https`` vs ``proxy http`` is the price of TLS alone (same proxy, same
server, same headers).

Usage (repository root; needs nginx, installed by ``.ci/run``)::

    .venv/bin/python benchmarks/tls_generator.py
    .venv/bin/python benchmarks/tls_generator.py --rounds 3 --rates 250,500,1000,2000

Prints a markdown table and writes ``benchmarks/results/tls_generator-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.certs import write_certificates  # noqa: E402  (needs the repository root)
from tests.support.real_triton import identity_model_config  # noqa: E402
from tests.support.servers import ReferenceProcess  # noqa: E402
from tests.support.tls import TlsProxy  # noqa: E402

TOKEN = "benchmark-token"
MODEL = "identity"


def perfsweep_load(url: str, level: list[str], extra: list[str], workdir: Path) -> list[dict]:
    """The results of one ``perfsweep load`` run (its ``--output`` document's levels)."""
    output = workdir / "load.json"
    output.unlink(missing_ok=True)
    command = [
        str(ROOT / ".venv" / "bin" / "perfsweep"),
        "load",
        "--url",
        url,
        "--model",
        MODEL,
        *level,
        "--window-s",
        "2",
        "--max-windows",
        "3",
        "--warmup-s",
        "1",
        "--output",
        str(output),
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFSWEEP_")}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    results: list[dict] = json.loads(output.read_text())["results"]
    return results


def per_core(level: dict) -> float:
    """Completed requests per second per generator core."""
    cpu = max(level["generator_cpu_pct"], 1e-9) / 100.0
    return float(level["throughput_rps"]) / cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rates", default="250,500,1000,1500,2000")
    args = parser.parse_args()
    rates = args.rates

    with tempfile.TemporaryDirectory(prefix="tls-bench-") as tmp:
        work = Path(tmp)
        certs = write_certificates(work / "certs")
        server = ReferenceProcess(work / "server", [identity_model_config()])
        with (
            server,
            TlsProxy(server.http_url, TOKEN, certs, work / "nginx_tls") as https,
            TlsProxy(server.http_url, TOKEN, certs, work / "nginx_plain", tls=False) as plain,
        ):
            token = ["--header", f"Authorization: Bearer {TOKEN}"]
            paths = {
                "direct": (f"http://{server.http_url}", []),
                "proxy http": (plain.url, token),
                "proxy https": (https.url, [*token, "--ssl-ca", str(certs.ca)]),
            }
            closed: dict[str, list[dict]] = {name: [] for name in paths}
            ladder: dict[str, list[list[dict]]] = {name: [] for name in paths}
            for round_index in range(args.rounds):
                for name, (url, extra) in paths.items():
                    print(f"round {round_index + 1}: {name}", file=sys.stderr)
                    level = ["--concurrency", str(args.concurrency)]
                    closed[name] += perfsweep_load(url, level, extra, work)
                    level = ["--rate-rps", rates]
                    ladder[name].append(perfsweep_load(url, level, extra, work))

    rows = []
    for name in paths:
        cores = [per_core(level) for level in closed[name]]
        throughput = [level["throughput_rps"] for level in closed[name]]
        valid_tops = [
            max((lv["target"] for lv in run if lv["valid"] and lv["error_count"] == 0), default=0)
            for run in ladder[name]
        ]
        rows.append(
            {
                "path": name,
                "closed_rps": statistics.median(throughput),
                "closed_rps_per_core": statistics.median(cores),
                "closed_p99_ms": statistics.median(lv["p99_ms"] for lv in closed[name]),
                "highest_valid_rate": min(valid_tops),
                "valid_tops": valid_tops,
                "ladder": [
                    [
                        {
                            k: lv[k]
                            for k in (
                                "target",
                                "throughput_rps",
                                "valid",
                                "error_count",
                                "generator_cpu_pct",
                                "send_lag_p99_ms",
                                "p99_ms",
                            )
                        }
                        for lv in run
                    ]
                    for run in ladder[name]
                ],
            }
        )
    base = next(r for r in rows if r["path"] == "proxy http")
    print(
        "| path | closed-loop req/s | req/s per generator core | vs proxy http | p99 ms "
        "| highest valid open-loop rate (each round) |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        ratio = r["closed_rps_per_core"] / base["closed_rps_per_core"]
        tops = ", ".join(f"{t:g}" for t in r["valid_tops"])
        print(
            f"| {r['path']} | {r['closed_rps']:.0f} | {r['closed_rps_per_core']:.0f} "
            f"| {ratio:.0%} | {r['closed_p99_ms']:.1f} | {tops} req/s |"
        )
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "benchmarks" / "results" / f"tls_generator-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    load_average = os.getloadavg()
    document = {
        "benchmark": "tls_generator",
        "command": " ".join(sys.argv),
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "rates": rates,
        "load_average_at_end": load_average,
        "rows": rows,
    }
    out.write_text(json.dumps(document, indent=2))
    print(f"\nwrote {out.relative_to(ROOT)} (1-min load average at the end {load_average[0]:.1f})")


if __name__ == "__main__":
    main()
