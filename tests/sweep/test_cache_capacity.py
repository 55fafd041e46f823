"""The same slow model with 0 % and 90 % repeated payloads: different capacities, both labelled.

A reference server (``--cache-config local,size=...``) serves one config twice, under two names
so that one run's cached responses cannot answer the other's: identity, 40 ms per execution,
one instance, no batcher -- about 25 req/s of model capacity. A capacity search through the
analyzer's own engine (``LocustLoadGenerator.find_capacity``) runs against each, with unique
payloads enough that nothing wraps round within the search; the cache's hits over the search
come from the server's statistics (``ServerScraper`` snapshots, ``cache_window``). With 90 % of
the traffic answered from the cache the model sees a tenth of it, so the capacity at the same
p99 goal is several times higher -- exactly the figure that must never be read without its hit
ratio.

The searches' range is what the claim needs, no more. Open loop on one 40 ms instance
(M/D/1), the p99 of the model's own latency passes the 200 ms goal up to about 14 req/s in
steady state (141 ms at 10, 443 ms at 20): from 10 req/s the unique search brackets its
capacity between 10 and 20. The repeated search sees a tenth of its rate at the model: at its
ceiling of 80 req/s that is 8 req/s, a steady-state p99 of 121 ms (and the p99 of all its
requests, hits included, is about the p90 of the misses'), well inside the goal, so it ends at
80, twice the 40 req/s that no unique search can pass (1.6 times the model's capacity).

The engine is gevent code: both searches run in one child, ``python -m
tests.sweep.test_cache_capacity`` (this module's :func:`main`), which prints their answers as
JSON.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.load.child import run_module
from tests.support.servers import cached_reference_server, write_model

pytestmark = pytest.mark.slow

#: Per-execution delay of the identity model, ms: about 25 executions a second.
DELAY_MS = 40
GOAL_P99_MS = 200.0
#: Each search's first rate and ceiling, req/s (see the module docstring).
START_RPS = 10.0
MAX_RPS = 80.0


def _config(name: str) -> str:
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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, spawns: None) -> Iterator[str]:
    root = tmp_path_factory.mktemp("cache-capacity")
    for name in ("fresh", "repeated"):
        write_model(root / "repo", name, _config(name))
    with cached_reference_server(root / "repo", 64 * 2**20) as url:
        yield url


def _searches(url: str, *searches: tuple[str, float]) -> list[dict[str, Any]]:
    """One capacity search per ``(model, repeat_ratio)``, in order, from one child."""
    spec = {
        "url": url,
        "searches": [{"model": m, "repeat_ratio": r} for m, r in searches],
        "unique_payloads": 20000,
    }
    done = run_module("tests.sweep.test_cache_capacity", stdin=json.dumps(spec), timeout_s=400.0)
    answers: list[dict[str, Any]] = done["answers"]
    return answers


def test_repeats_raise_the_capacity_and_both_figures_carry_their_hit_ratio(server: str) -> None:
    from analyzer.report.points import with_hits

    fresh, repeated = _searches(server, ("fresh", 0.0), ("repeated", 0.9))
    # Unique payloads only: the cache is asked about every request and never answers one.
    assert fresh["hits"] == 0 and fresh["misses"] > 100, fresh
    assert 0.8 < repeated["hit_ratio"] < 0.95, repeated
    assert fresh["capacity_rps"] > 0 and fresh["bracketed"], fresh
    assert repeated["capacity_rps"] > 2 * fresh["capacity_rps"], (fresh, repeated)
    labels = [
        with_hits(f"{a['capacity_rps']:.0f} req/s", a["hit_ratio"]) for a in (fresh, repeated)
    ]
    assert re.fullmatch(r"\d+ req/s · 0 % cache hits", labels[0]), labels
    assert re.fullmatch(r"\d+ req/s · (8\d|9[0-4]) % cache hits", labels[1]), labels
    # Once ServerView carries the counts, the capacity's own level says the same.
    for answer in (fresh, repeated):
        if answer["best_hit_ratio"] is not None:
            assert abs(answer["best_hit_ratio"] - answer["hit_ratio"]) < 0.1, answer


def main() -> None:
    """Child side: a capacity search against ``url`` for each of ``searches`` (model and repeat
    ratio), one after the other; prints ``{"answers": [...]}`` as JSON."""
    spec = json.loads(sys.stdin.read())
    answers = [
        _capacity(spec["url"], s["model"], s["repeat_ratio"], spec["unique_payloads"])
        for s in spec["searches"]
    ]
    print(json.dumps({"answers": answers}), flush=True)


def _capacity(url: str, model: str, repeat_ratio: float, unique_payloads: int) -> dict[str, Any]:
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
    capacity = CapacitySpec(
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
        result = generator.find_capacity(capacity)
        after = scraper.snapshot()
    window = cache_window(before, after)
    return {
        "capacity_rps": result.capacity_rps,
        "bracketed": result.bracketed,
        "steps": len(result.points),
        "hits": window.hits if window else 0,
        "misses": window.misses if window else 0,
        "hit_ratio": window.hit_ratio if window else None,
        "best_hit_ratio": cache_hit_ratio(result.best.server) if result.best else None,
    }


if __name__ == "__main__":
    main()
