"""Server-side deltas from planted statistics and metrics documents."""

from __future__ import annotations

import pytest

from analyzer.measure.measurement import ServerView
from analyzer.target.server_stats import (
    MetricsSnapshot,
    ServerScraper,
    ServerSnapshot,
    StatsSnapshot,
    combine_views,
    http_stats_source,
    parse_metrics,
    parse_model_stats,
    server_view,
)
from analyzer.target.transport import HTTPStatusError, MockTransport, Response

METRICS_URL = "http://server.invalid:8002/metrics"
STATS_URL = "http://server.invalid:8000/v2/models/m/stats"


def _raise(error: OSError) -> Response:
    raise error


def _stats_doc(
    success: int, queue_ns: int, infer_ns: int, batches: dict[int, int], grpc: bool = False
) -> dict:
    def num(v: int) -> int | str:
        return str(v) if grpc else v  # tritonclient.grpc's as_json renders int64 as strings

    inferences = sum(size * n for size, n in batches.items())
    return {
        "model_stats": [
            {
                "name": "m",
                "version": "1",
                "inference_count": num(inferences),
                "execution_count": num(sum(batches.values())),
                "inference_stats": {
                    "success": {"count": num(success), "ns": num(success * 2_000_000)},
                    "fail": {"count": num(1), "ns": num(10)},
                    "queue": {"count": num(success), "ns": num(queue_ns)},
                    "compute_input": {"count": num(success), "ns": num(success * 1000)},
                    "compute_infer": {"count": num(success), "ns": num(infer_ns)},
                    "compute_output": {"count": num(success), "ns": num(success * 3000)},
                    "cache_hit": {"count": 0, "ns": 0},
                    "cache_miss": {"count": 0, "ns": 0},
                },
                "batch_stats": [
                    {"batch_size": num(size), "compute_infer": {"count": num(n), "ns": num(0)}}
                    for size, n in sorted(batches.items())
                ],
            },
            {"name": "other", "inference_count": 999, "execution_count": 999},
        ]
    }


METRICS = """\
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="m",reason="REJECTED",version="1"} %d
nv_inference_request_failure{model="m",reason="BACKEND",version="1"} 2
nv_inference_request_failure{model="other",reason="REJECTED",version="1"} 50
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="m",version="1"} %d
"""


@pytest.mark.parametrize("grpc", [False, True])
def test_deltas_give_per_request_times_and_batch_histogram(grpc: bool) -> None:
    before = ServerSnapshot(
        parse_model_stats(_stats_doc(100, 10_000_000, 50_000_000, {1: 100}, grpc), "m"),
        parse_metrics(METRICS % (3, 0), "m"),
    )
    # 400 more requests: 40 executions of 4, 40 of 6 -> 400 inferences in 80 executions... plus the old
    after = ServerSnapshot(
        parse_model_stats(
            _stats_doc(
                500,
                10_000_000 + 400 * 250_000,
                50_000_000 + 400 * 1_500_000,
                {1: 100, 4: 40, 6: 40},
                grpc,
            ),
            "m",
        ),
        parse_metrics(METRICS % (7, 5), "m"),
    )
    view = server_view(before, after)
    assert view is not None
    assert view.success_count == 400
    assert view.execution_count == 80
    assert view.inference_count == 400
    assert view.avg_batch_size == pytest.approx(5.0)
    assert view.queue_us == pytest.approx(250.0)
    assert view.compute_infer_us == pytest.approx(1500.0)
    assert view.compute_input_us == pytest.approx(1.0)
    assert view.compute_output_us == pytest.approx(3.0)
    assert view.batch_sizes == {4: 40, 6: 40}
    assert view.failures_by_reason == {"BACKEND": 0, "REJECTED": 4}
    assert view.pending_requests == 5


def test_metrics_only_and_nothing() -> None:
    m0, m1 = parse_metrics(METRICS % (0, 0), "m"), parse_metrics(METRICS % (3, 1), "m")
    view = server_view(ServerSnapshot(None, m0), ServerSnapshot(None, m1))
    assert view is not None and view.failure_count == 3 and view.pending_requests == 1
    assert server_view(ServerSnapshot(None, None), ServerSnapshot(None, None)) is None


def test_unreadable_sources_degrade_to_none() -> None:
    def broken() -> dict:
        raise ConnectionRefusedError("nobody home")

    refused = MockTransport(lambda r: _raise(ConnectionRefusedError(111, "Connection refused")))
    scraper = ServerScraper("m", broken, METRICS_URL, timeout_s=0.5, transport=refused)
    snap = scraper.snapshot()
    assert snap == ServerSnapshot(None, None)
    assert "stats" in scraper.errors and "metrics" in scraper.errors
    assert [(r.method, r.url, r.timeout_s) for r in refused.requests] == [("GET", METRICS_URL, 0.5)]


def test_scrapes_go_through_the_transport_and_a_non_2xx_answer_is_no_page() -> None:
    pages = {
        METRICS_URL: Response(200, (METRICS % (3, 1)).encode()),
        STATS_URL: Response.of_json(200, _stats_doc(5, 0, 0, {1: 5})),
    }
    transport = MockTransport(lambda r: pages.get(r.url, Response(404, b"no such page")))
    stats = http_stats_source("server.invalid:8000", "m", transport=transport)
    snap = ServerScraper("m", stats, METRICS_URL, transport=transport).snapshot()
    assert snap.stats is not None and snap.stats.durations["success"][0] == 5
    assert snap.metrics is not None and snap.metrics.pending_requests == 1
    missing = ServerScraper("m", None, "http://server.invalid:8002/nope", transport=transport)
    assert missing.snapshot().metrics is None
    assert missing.errors["metrics"] == "HTTPStatusError: HTTP Error 404: no such page"
    optional = ServerScraper(
        "m", None, "http://server.invalid:8002/nope", metrics_optional=True, transport=transport
    )
    assert optional.snapshot().metrics is None and optional.metrics_url is None
    with pytest.raises(HTTPStatusError, match="HTTP Error 404"):
        http_stats_source("http://server.invalid:8000", "other", transport=transport)()


def test_wait_drained_uses_statistics_quiescence_without_metrics() -> None:
    docs = iter([_stats_doc(n, 0, 0, {1: n}) for n in (1, 2, 3, 3, 3, 3, 3)])
    clock = [0.0]
    scraper = ServerScraper("m", lambda: next(docs), None)
    drained = scraper.wait_drained(
        10.0, sleep=lambda s: clock.__setitem__(0, clock[0] + s), clock=lambda: clock[0]
    )
    assert drained
    assert 0.4 <= clock[0] <= 0.6  # 3 changing polls, then 2 quiet ones


def test_wait_drained_times_out_when_stats_keep_moving() -> None:
    counter = iter(range(10**6))
    clock = [0.0]
    scraper = ServerScraper("m", lambda: _stats_doc(next(counter), 0, 0, {}), None)
    assert not scraper.wait_drained(
        1.0, sleep=lambda s: clock.__setitem__(0, clock[0] + s), clock=lambda: clock[0]
    )


def test_snapshot_records_are_plain_values() -> None:
    assert StatsSnapshot() == StatsSnapshot()
    assert MetricsSnapshot().pending_requests is None


def test_combine_views_weights_times_by_successes() -> None:
    a = ServerView(
        success_count=100,
        inference_count=100,
        execution_count=100,
        queue_us=100.0,
        compute_infer_us=1000.0,
        batch_sizes={1: 100},
        failures_by_reason={"REJECTED": 1},
        pending_requests=3,
    )
    b = ServerView(
        success_count=300,
        inference_count=300,
        execution_count=75,
        queue_us=500.0,
        compute_infer_us=2000.0,
        batch_sizes={4: 75},
        failures_by_reason={"REJECTED": 2},
        failure_count=2,
        pending_requests=0,
    )
    c = combine_views([a, None, b])
    assert c is not None
    assert c.success_count == 400 and c.execution_count == 175
    assert c.avg_batch_size == pytest.approx(400 / 175)
    assert c.queue_us == pytest.approx((100 * 100 + 300 * 500) / 400)
    assert c.compute_infer_us == pytest.approx((100 * 1000 + 300 * 2000) / 400)
    assert c.batch_sizes == {1: 100, 4: 75}
    assert c.failures_by_reason == {"REJECTED": 3} and c.failure_count == 2
    assert c.pending_requests == 0
    assert combine_views([None, None]) is None
