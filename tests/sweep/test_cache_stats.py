"""Response-cache hits and misses per window, from planted documents and a real reference server.

The statistics' ``cache_hit``/``cache_miss`` counts are the first source, the per-model
``nv_cache_num_*_per_model`` counters the fallback; a window that looked nothing up has no
cache figure at all (a model without the cache is not "0 % hits").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from analyzer.measure.measurement import ServerView
from analyzer.target.server_stats import (
    CacheWindow,
    MetricsSnapshot,
    ServerScraper,
    ServerSnapshot,
    StatsSnapshot,
    cache_hit_ratio,
    cache_window,
    combine_views,
    http_stats_source,
    parse_metrics,
    parse_model_stats,
    server_view,
)
from reference_server.app import ServerOptions, ServerThread
from tests.core.conftest import identity_config, write_model

#: Triton 2.51's page for a model with the cache on (counter families without ``_total``).
TRITON_PAGE = """\
# HELP nv_cache_num_hits_per_model Number of cache hits per model
# TYPE nv_cache_num_hits_per_model counter
nv_cache_num_hits_per_model{model="m",version="1"} 9
nv_cache_num_hits_per_model{model="other",version="1"} 100
# HELP nv_cache_num_misses_per_model Number of cache misses per model
# TYPE nv_cache_num_misses_per_model counter
nv_cache_num_misses_per_model{model="m",version="1"} 3
"""


def _doc(hits: int | str, misses: int | str) -> dict:
    return {
        "model_stats": [
            {
                "name": "m",
                "version": "1",
                "inference_stats": {
                    "success": {"count": 12, "ns": 1},
                    "cache_hit": {"count": hits, "ns": 5},
                    "cache_miss": {"count": misses, "ns": 7},
                },
            },
            {
                "name": "other",
                "version": "1",
                "inference_stats": {"cache_hit": {"count": 50}, "cache_miss": {"count": 1}},
            },
        ]
    }


def test_statistics_cache_counts_of_the_model_only_also_as_grpc_strings() -> None:
    assert parse_model_stats(_doc(9, 3), "m").cache_hits == 9
    snap = parse_model_stats(_doc("9", "3"), "m")
    assert (snap.cache_hits, snap.cache_misses) == (9, 3)


def test_per_model_cache_counters_from_triton_s_page() -> None:
    snap = parse_metrics(TRITON_PAGE, "m")
    assert (snap.cache_hits, snap.cache_misses) == (9, 3)
    # No cache family for the model: no figure, not zero.
    assert parse_metrics(TRITON_PAGE, "absent").cache_hits is None


def test_window_hits_come_from_statistics_before_metrics() -> None:
    before = ServerSnapshot(StatsSnapshot(cache_hits=10, cache_misses=5), MetricsSnapshot())
    after = ServerSnapshot(
        StatsSnapshot(cache_hits=19, cache_misses=6),
        MetricsSnapshot(cache_hits=999, cache_misses=999),
    )
    window = cache_window(before, after)
    assert window == CacheWindow(hits=9, misses=1)
    assert window.hit_ratio == pytest.approx(0.9)


def test_window_falls_back_to_metrics_and_is_none_without_lookups() -> None:
    before = ServerSnapshot(None, MetricsSnapshot(cache_hits=0, cache_misses=0))
    after = ServerSnapshot(None, MetricsSnapshot(cache_hits=9, cache_misses=1))
    assert cache_window(before, after) == CacheWindow(hits=9, misses=1)
    same = ServerSnapshot(StatsSnapshot(cache_hits=4, cache_misses=4), None)
    assert cache_window(same, same) is None
    assert cache_window(ServerSnapshot(None, None), ServerSnapshot(None, None)) is None
    assert CacheWindow(0, 0).hit_ratio is None


def test_a_view_without_cache_counts_has_no_ratio() -> None:
    assert cache_hit_ratio(None) is None
    assert cache_hit_ratio(ServerView(success_count=10)) is None


def test_views_carry_the_counts_and_combine_by_adding() -> None:
    b = ServerSnapshot(StatsSnapshot(cache_hits=0, cache_misses=0), None)
    a = ServerSnapshot(StatsSnapshot(cache_hits=9, cache_misses=1), None)
    view = server_view(b, a)
    assert cache_hit_ratio(view) == pytest.approx(0.9)
    c = ServerSnapshot(StatsSnapshot(cache_hits=9, cache_misses=11), None)
    both = combine_views([view, server_view(a, c)])
    assert cache_hit_ratio(both) == pytest.approx(9 / 20)
    assert ServerView.from_dict(both.to_dict()) == both


@pytest.mark.parametrize("source", ["stats", "metrics"])
@pytest.mark.usefixtures("serves")
def test_a_window_on_a_reference_server_with_the_cache_on(tmp_path: Path, source: str) -> None:
    write_model(tmp_path, "c", identity_config("c", "response_cache { enable: true }"))
    options = ServerOptions(
        model_repositories=(tmp_path,), models=("c",), cache_config=("local,size=1048576",)
    )
    with ServerThread(options) as server:
        scraper = ServerScraper(
            "c",
            http_stats_source(server.http_url, "c") if source == "stats" else None,
            server.metrics_url if source == "metrics" else None,
        )
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            _infer(client, 0.0)  # before the window: a miss that fills the cache
            before = scraper.snapshot()
            for value in (0.0, 0.0, 0.0, 1.0):  # three hits, one new payload
                _infer(client, value)
            after = scraper.snapshot()
        finally:
            client.close()
            scraper.close()
    assert cache_window(before, after) == CacheWindow(hits=3, misses=1)
    assert cache_hit_ratio(server_view(before, after)) == pytest.approx(0.75)


def _infer(client: httpclient.InferenceServerClient, value: float) -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, dtype=np.float32))
    client.infer("c", [tensor])
