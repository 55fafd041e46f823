"""Queue policies (REJECT/DELAY timeouts, max_queue_size) and priority levels (§3.2, §3.3)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from reference_server.core.errors import Code, ServerError
from tests.core.conftest import (
    Collector,
    ServerFactory,
    batch_stats,
    identity_config,
    metric,
    pending,
    request,
    wait_until,
    write_model,
)


def stats_of(server, model: str) -> dict:  # type: ignore[no-untyped-def, type-arg]
    return server.model_statistics(model)["model_stats"][0]


def test_max_queue_size_refuses_with_triton_message(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 300000 "
            "default_queue_policy { max_queue_size: 1 } }",
        ),
    )
    server = make_server()
    col = Collector()
    server.submit(request("m", 0.0, "first"), col.callback("first"))
    wait_until(lambda: pending(server, "m") == 1, 10, "one request waits in the queue")
    server.submit(request("m", 1.0, "second"), col.callback("second"))
    # The refusal is synchronous: it is already there.
    second = col.results["second"]
    assert isinstance(second, ServerError)
    assert second.code is Code.UNAVAILABLE
    assert second.message == "[request id: second] Exceeds maximum queue size"
    assert pending(server, "m") == 1, "the refused request left the gauge unchanged"
    col.wait(2)
    assert not isinstance(col.results["first"], Exception)
    s = stats_of(server, "m")
    assert s["inference_stats"]["fail"]["count"] == 0, "queue-full is not a counted failure"
    assert s["inference_stats"]["success"]["count"] == 1


def test_max_queue_size_non_prefetch_rejects_exactly_the_overflow(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    # §11 B.15: instance busy with a bs=8 request, 10 more bs=1 with max_queue_size 8 -> 2 refused.
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [8] default_queue_policy { max_queue_size: 8 } }",
        ),
    )
    server = make_server()
    col = Collector()
    server.submit(request("m", 0.0, "busy", batch=8, delay_ms=300), col.callback("busy"))
    wait_until(
        lambda: pending(server, "m") == 0, 10, "the first request left the queue (it executes)"
    )
    for i in range(10):
        server.submit(request("m", float(i), str(i)), col.callback(str(i)))
    col.wait(11)
    refused = [r for r in col.results.values() if isinstance(r, ServerError)]
    assert len(refused) == 2
    assert all("Exceeds maximum queue size" in r.message for r in refused)
    assert batch_stats(server, "m") == {8: 2}


def test_reject_timeout_then_later_requests_batch(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    # §11 B.16: REJECT timeout 100 ms, D = 10 s, P = [4, 8].
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [4, 8] max_queue_delay_microseconds: 10000000 "
            "default_queue_policy { default_timeout_microseconds: 100000 } }",
        ),
    )
    server = make_server()
    col = Collector()
    start = time.monotonic()
    server.submit(request("m", 0.0, "a"), col.callback("a"))
    col.wait(1, timeout=5)
    first = col.results["a"]
    assert isinstance(first, ServerError) and first.code is Code.UNAVAILABLE
    assert first.message == "Request timeout expired"
    assert col.times["a"] - start >= 0.09
    server.submit(request("m", 1.0, "b", batch=2), col.callback("b"))
    server.submit(request("m", 2.0, "c", batch=2), col.callback("c"))
    col.wait(3, timeout=5)  # far below D: the two formed the preferred size 4
    assert batch_stats(server, "m") == {4: 1}
    s = stats_of(server, "m")
    assert s["inference_stats"]["fail"]["count"] == 1
    assert (
        metric(server, 'nv_inference_request_failure{model="m",reason="REJECTED",version="1"}') == 1
    )
    assert pending(server, "m") == 0


@pytest.mark.usefixtures("takes_seconds")
def test_delay_timeout_moves_request_behind(tmp_path: Path, make_server: ServerFactory) -> None:
    # §11 B.17: with DELAY the expired request is not refused; later ones run first.
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [4, 8] max_queue_delay_microseconds: 1000000 "
            "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100000 } }",
        ),
    )
    server = make_server()
    col = Collector()
    start = time.monotonic()
    server.submit(request("m", 0.0, "a"), col.callback("a"))
    time.sleep(0.2)  # the scenario: "a" outlives its 100 ms timeout before b and c arrive
    server.submit(request("m", 1.0, "b", batch=2), col.callback("b"))
    server.submit(request("m", 2.0, "c", batch=2), col.callback("c"))
    col.wait(3)
    assert col.order[-1] == "a"
    assert all(not isinstance(r, Exception) for r in col.results.values())
    assert col.times["a"] - start >= 0.99, "the delayed request waited for the queue delay"
    assert batch_stats(server, "m") == {1: 1, 4: 1}


@pytest.mark.usefixtures("takes_seconds")
def test_timeout_override_shortens_only(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 5000000 "
            "default_queue_policy { default_timeout_microseconds: 1000000 allow_timeout_override: true } }",
        ),
    )
    server = make_server()
    col = Collector()
    start = time.monotonic()
    server.submit(request("m", 0.0, "long", timeout_us=10_000_000), col.callback("long"))
    server.submit(request("m", 0.0, "short", timeout_us=100_000), col.callback("short"))
    col.wait(2, timeout=10)
    assert all(isinstance(r, ServerError) for r in col.results.values())
    assert col.order == ["short", "long"], "100 ms override honoured, 10 s capped at 1 s"
    assert col.times["short"] - start >= 0.09
    assert col.times["long"] - start >= 0.95, "10 s ignored: the 1 s default applies"


def test_priority_level_one_served_first(tmp_path: Path, make_server: ServerFactory) -> None:
    # §11 B.19: levels 2 (default 2), P=[4,8]: bs2, bs1 (default), then bs2 at priority 1
    # -> the priority-1 request and the first request form a batch of 4; bs1 waits.
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [4, 8] max_queue_delay_microseconds: 400000 "
            "priority_levels: 2 default_priority_level: 2 }",
        ),
    )
    server = make_server(delay_scheduler=3)
    col = Collector()
    start = time.monotonic()
    server.submit(request("m", 0.0, "a", batch=2), col.callback("a"))
    server.submit(request("m", 1.0, "b", batch=1, priority=99), col.callback("b"))
    server.submit(request("m", 2.0, "c", batch=2, priority=1), col.callback("c"))
    col.wait(3)
    assert set(col.order[:2]) == {"a", "c"} and col.order[2] == "b"
    assert batch_stats(server, "m") == {1: 1, 4: 1}
    assert col.times["b"] - start >= 0.39, "priority 99 mapped to the default level and waited"


@pytest.mark.parametrize("priority", [0, 99])
def test_out_of_range_priority_is_default_level(
    tmp_path: Path, make_server: ServerFactory, priority: int
) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config("m", "dynamic_batching { priority_levels: 2 default_priority_level: 1 }"),
    )
    server = make_server()
    out = server.infer_sync(request("m", 3.0, "x", priority=priority), timeout_s=10)
    assert out.outputs["OUTPUT0"].tolist() == [[3.0] * 4]


def test_cancelled_while_queued(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "m",
        identity_config(
            "m",
            "dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 20000000 "
            "default_queue_policy { max_queue_size: 10 } }",
        ),
    )
    server = make_server()
    col = Collector()
    req = request("m", 0.0, "gone")
    server.submit(req, col.callback("gone"))
    wait_until(lambda: pending(server, "m") == 1, 10, "one request waits in the queue")
    req.cancel()
    col.wait(1, timeout=5)  # at once, not after the 20 s queue delay
    result = col.results["gone"]
    assert isinstance(result, ServerError) and result.code is Code.CANCELLED
    assert (
        metric(server, 'nv_inference_request_failure{model="m",reason="CANCELED",version="1"}') == 1
    )
    assert pending(server, "m") == 0
    stats = server.model_statistics("m")["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 1


def test_unload_returns_before_in_flight_work_finishes(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(tmp_path, "m", identity_config("m", "dynamic_batching {}"))
    server = make_server(models=("m",))
    col = Collector()
    server.submit(request("m", 4.0, "slow", delay_ms=400), col.callback("slow"))
    wait_until(
        lambda: pending(server, "m") == 0, 10, "the first request left the queue (it executes)"
    )
    server.unload_model("m")
    assert server.repository_index() == [{"name": "m", "version": "1", "state": "UNLOADING"}]
    assert "slow" not in col.results
    col.wait(1)
    result = col.results["slow"]
    assert not isinstance(result, Exception), "in-flight request finished normally"
    wait_until(
        lambda: server.repository_index()[0]["state"] == "UNAVAILABLE", 10, "the unload to finish"
    )
