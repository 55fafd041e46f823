"""Repeated payloads raise a model's capacity: the same slow model with 0 % and 90 % repeats.

A reference server (``--cache-size``, ``response_cache { enable: true }``) serves one config
twice, under two names so that one search's cached responses cannot answer the other's:
identity, 40 ms per execution, one instance, no batcher -- about 25 req/s of model capacity. A
capacity search through the analyzer's own engine (``LocustLoadGenerator.find_capacity``, p99
goal 200 ms, open loop) runs against each, with unique payloads enough that nothing wraps round
within the search: ``fresh`` with unique payloads only, ``repeated`` with 90 % of the requests
repeating an earlier payload. The cache's hits over each search come from the server's
statistics (``ServerScraper`` snapshots, ``cache_window``). With 90 % of the traffic answered
from the cache the model sees a tenth of it, so the capacity at the same goal is several times
higher -- the figure that must never be read without its hit ratio (each is recorded with its
label, ``analyzer.report.points.with_hits``).

The searches' range is what the claim needs, no more. Open loop on one 40 ms instance (M/D/1),
the p99 of the model's own latency passes the 200 ms goal up to about 14 req/s in steady state
(141 ms at 10, 443 ms at 20): from 10 req/s the fresh search brackets its capacity between 10
and 20. The repeated search sees a tenth of its rate at the model: at its ceiling of 80 req/s
that is 8 req/s, a steady-state p99 of 121 ms, well inside the goal, so it ends at 80, twice the
40 req/s that no fresh search can pass.

Claim (the JSON's ``claims``): ``repeated capacity_rps > 2 * fresh capacity_rps``; beside it,
whether the fresh search was bracketed and saw no hit, and whether the repeated one's hit ratio
is 80-95 %.

The engine is gevent code: both searches run in one child, ``python -m
benchmarks.cache_capacity --child`` (the spec as JSON on its stdin, the answers as JSON on its
stdout), so this process is never patched.

Command (repository root): ``.venv/bin/python benchmarks/cache_capacity.py`` (about a minute).
Prints a markdown table and writes ``benchmarks/results/cache_capacity-<UTC>.json``
(``format_version`` 1). Loopback only; the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.report.points import with_hits  # noqa: E402
from benchmarks.record import run_recorded  # noqa: E402
from tests.load.child import run_module  # noqa: E402
from tests.support.servers import cached_reference_server, write_model  # noqa: E402

FORMAT_VERSION = 1

#: Per-execution delay of the identity model, ms: about 25 executions a second.
DELAY_MS = 40
GOAL_P99_MS = 200.0
#: Each search's first rate and ceiling, req/s (see the module docstring).
START_RPS = 10.0
MAX_RPS = 80.0
#: Distinct payloads each search draws from: more than either sends.
UNIQUE_PAYLOADS = 20000
#: Each model (one config, two names) and the share of its requests that repeat a payload.
SEARCHES = (("fresh", 0.0), ("repeated", 0.9))
CACHE_BYTES = 64 * 2**20


def model_config(name: str) -> str:
    return f"""
name: "{name}"
backend: "identity"
max_batch_size: 8
input {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }}
output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }}
instance_group [{{ count: 1 kind: KIND_CPU }}]
parameters {{ key: "execute_delay_ms" value {{ string_value: "{DELAY_MS}" }} }}
response_cache {{ enable: true }}
"""


def run(work: Path) -> dict[str, Any]:
    for name, _ in SEARCHES:
        write_model(work / "repo", name, model_config(name))
    with cached_reference_server(work / "repo", CACHE_BYTES) as url:
        spec = {
            "url": url,
            "searches": [{"model": m, "repeat_ratio": r} for m, r in SEARCHES],
            "unique_payloads": UNIQUE_PAYLOADS,
        }
        done = run_module(
            "benchmarks.cache_capacity", "--child", stdin=json.dumps(spec), timeout_s=400.0
        )
    answers = dict(zip((name for name, _ in SEARCHES), done["answers"], strict=True))
    for (_, ratio), answer in zip(SEARCHES, answers.values(), strict=True):
        answer["repeat_ratio"] = ratio
        answer["label"] = with_hits(f"{answer['capacity_rps']:.0f} req/s", answer["hit_ratio"])
    fresh, repeated = answers["fresh"], answers["repeated"]
    return {
        "model": {"execute_delay_ms": DELAY_MS, "instances": 1, "dynamic_batching": False},
        "goal_p99_ms": GOAL_P99_MS,
        "start_rps": START_RPS,
        "max_rps": MAX_RPS,
        "unique_payloads": UNIQUE_PAYLOADS,
        "searches": answers,
        "capacity_ratio": (
            round(repeated["capacity_rps"] / fresh["capacity_rps"], 3)
            if fresh["capacity_rps"]
            else None
        ),
        "claims": {
            "repeated capacity_rps > 2 * fresh capacity_rps": (
                repeated["capacity_rps"] > 2 * fresh["capacity_rps"]
            ),
            "fresh: bracketed, capacity > 0": bool(
                fresh["bracketed"] and fresh["capacity_rps"] > 0
            ),
            "fresh: no cache hit, > 100 lookups": fresh["hits"] == 0 and fresh["misses"] > 100,
            "repeated: hit ratio 80-95 %": (
                repeated["hit_ratio"] is not None and 0.8 < repeated["hit_ratio"] < 0.95
            ),
            "each capacity's own level: its search's hit ratio within 0.1 (where recorded)": all(
                abs(a["best_hit_ratio"] - (a["hit_ratio"] or 0.0)) < 0.1
                for a in answers.values()
                if a["best_hit_ratio"] is not None
            ),
        },
    }


def table(result: Mapping[str, Any]) -> str:
    rows = [
        f"| search | repeats | capacity at p99 {result['goal_p99_ms']:g} ms, with its hit ratio "
        "| bracketed | cache hits | cache misses |",
        "|---|---|---|---|---|---|",
    ]
    for name, a in result["searches"].items():
        rows.append(
            f"| {name} | {100 * a['repeat_ratio']:.0f} % | {a['label']} "
            f"| {'yes' if a['bracketed'] else 'no'} | {a['hits']} | {a['misses']} |"
        )
    rows.append(f"\nrepeated / fresh capacity: {result['capacity_ratio']}x\n")
    rows += [
        f"- {text}: **{'held' if held else 'did not hold'}**"
        for text, held in result["claims"].items()
    ]
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------
# The child: the load engine (gevent) in a process of its own


def child() -> None:
    """A capacity search against the spec's ``url`` for each of its ``searches`` (model and
    repeat ratio), one after the other; prints ``{"answers": [...]}`` as JSON."""
    spec = json.loads(sys.stdin.read())
    answers = [
        capacity(spec["url"], s["model"], s["repeat_ratio"], spec["unique_payloads"])
        for s in spec["searches"]
    ]
    print(json.dumps({"answers": answers}), flush=True)


def capacity(url: str, model: str, repeat_ratio: float, unique_payloads: int) -> dict[str, Any]:
    from analyzer.load import EngineOptions, LocustLoadGenerator
    from analyzer.load.inputs import InputOptions
    from analyzer.measure.specs import CapacitySpec, Goals, LoadMode, LoadSpec
    from analyzer.target.server_stats import (
        ServerScraper,
        cache_hit_ratio,
        cache_window,
        http_stats_source,
    )

    options = EngineOptions(
        url=url,
        model=model,
        inputs=InputOptions(
            shapes={"INPUT0": [16]},
            unique_payloads=unique_payloads,
            repeat_ratio=repeat_ratio,
        ),
    )
    step = LoadSpec(
        LoadMode.REQUEST_RATE,
        1.0,
        warmup_s=0.5,
        window_s=1.0,
        stable_windows=2,
        max_windows=3,
        stability_pct=30.0,
        seed=1,
    )
    spec = CapacitySpec(
        Goals(p99_ms=GOAL_P99_MS, max_error_rate=0.01),
        start_rps=START_RPS,
        max_rps=MAX_RPS,
        resolution=0.25,
        step=step,
        drain_timeout_s=15.0,
    )
    scraper = ServerScraper(model, http_stats_source(url, model), None)
    with LocustLoadGenerator(options) as generator:
        before = scraper.snapshot()
        result = generator.find_capacity(spec)
        after = scraper.snapshot()
    window = cache_window(before, after)
    return {
        "capacity_rps": result.capacity_rps,
        "bracketed": result.bracketed,
        "steps": len(result.points),
        "hits": window.hits if window else 0,
        "misses": window.misses if window else 0,
        "hit_ratio": window.hit_ratio if window else None,
        # The capacity's own level, as its record carries it: the same ratio as the window's.
        "best_hit_ratio": cache_hit_ratio(result.best.server) if result.best else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path)
    parser.add_argument("--keep", type=Path, help="copy the work directory here")
    parser.add_argument(
        "--child", action="store_true", help="internal: run the searches of a spec on stdin"
    )
    args = parser.parse_args()
    if args.child:
        child()
        return 0
    return run_recorded(
        "cache_capacity", FORMAT_VERSION, run, table, output=args.output, keep=args.keep
    )


if __name__ == "__main__":
    if re.search(r"\bpytest\b", sys.argv[0]):  # pragma: no cover
        raise SystemExit("run this file directly, not through pytest")
    raise SystemExit(main())
