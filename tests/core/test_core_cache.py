"""Response cache (§4): hits bypass the scheduler, stats/metrics, keys, LRU eviction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from reference_server.core.cache import ResponseCache, cache_key
from reference_server.core.errors import ServerError
from reference_server.core.types import InferRequest, InferResponse
from tests.core.conftest import (
    Collector,
    ServerFactory,
    identity_config,
    metric,
    request,
    wait_until,
    write_model,
)

CACHED = 'response_cache { enable: true }\nparameters { key: "execute_delay_ms" value { string_value: "5" } }'


def stats(server, model: str = "c") -> dict:  # type: ignore[no-untyped-def, type-arg]
    return server.model_statistics(model)["model_stats"][0]


def test_second_identical_request_is_a_hit(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(tmp_path, "c", identity_config("c", CACHED))
    server = make_server(models=("c",), cache_size_bytes=1 << 20)
    first = server.infer_sync(request("c", 5.0, "one"), 10)
    second = server.infer_sync(request("c", 5.0, "two"), 10)
    assert second.id == "two"
    assert second.outputs["OUTPUT0"].tolist() == first.outputs["OUTPUT0"].tolist()
    s = stats(server)
    inf = s["inference_stats"]
    assert inf["cache_hit"]["count"] == 1 and inf["cache_miss"]["count"] == 1
    assert inf["success"]["count"] == 2 and inf["queue"]["count"] == 2
    assert inf["compute_infer"]["count"] == 1
    assert s["inference_count"] == 1 and s["execution_count"] == 1
    labels = '{model="c",version="1"}'
    assert metric(server, f"nv_cache_num_hits_per_model{labels}") == 1
    assert metric(server, f"nv_cache_num_misses_per_model{labels}") == 1
    assert metric(server, f"nv_inference_count{labels}") == 1
    assert metric(server, "nv_cache_num_entries") == 1
    assert metric(server, "nv_cache_num_lookups") == 2


def test_same_bytes_other_shape_hits(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "c",
        identity_config("c", "response_cache { enable: true }", dims="-1"),
    )
    server = make_server(models=("c",), cache_size_bytes=1 << 20)
    server.infer_sync(request("c", 1.0, shape=(1, 4)), 10)
    hit = server.infer_sync(request("c", 1.0, shape=(2, 2)), 10)
    assert hit.outputs["OUTPUT0"].shape == (1, 4), "Triton keys on bytes only"
    assert stats(server)["inference_stats"]["cache_hit"]["count"] == 1


@pytest.mark.usefixtures("takes_seconds")
def test_hit_served_even_when_queue_full(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "c",
        identity_config(
            "c",
            "response_cache { enable: true }\n"
            "dynamic_batching { max_queue_delay_microseconds: 500000 "
            "default_queue_policy { max_queue_size: 1 } }",
        ),
    )
    server = make_server(models=("c",), cache_size_bytes=1 << 20)
    server.infer_sync(request("c", 7.0), 10)  # fills the cache (waits the delay)
    col = Collector()
    server.submit(request("c", 1.0, "queued"), col.callback("queued"))
    wait_until(
        lambda: metric(server, 'nv_inference_pending_request_count{model="c",version="1"}') == 1,
        10,
        "one request waits in the queue",
    )
    server.submit(request("c", 2.0, "full"), col.callback("full"))
    server.submit(request("c", 7.0, "hit"), col.callback("hit"))
    assert isinstance(col.results["full"], ServerError)
    assert not isinstance(col.results["hit"], Exception), "lookup precedes queueing"
    col.wait(3)


def test_model_enabled_without_server_cache_never_caches(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(tmp_path, "c", identity_config("c", CACHED))
    server = make_server(models=("c",))
    server.infer_sync(request("c", 5.0), 10)
    server.infer_sync(request("c", 5.0), 10)
    s = stats(server)
    assert s["execution_count"] == 2
    assert s["inference_stats"]["cache_hit"]["count"] == 0
    assert "nv_cache_num_hits_per_model" not in server.metrics_text()


def test_key_ignores_input_order_but_not_names() -> None:
    a = np.arange(4, dtype=np.float32)
    b = np.ones(3, dtype=np.int32)
    assert cache_key("m", "1", {"x": a, "y": b}) == cache_key("m", "1", {"y": b, "x": a})
    assert cache_key("m", "1", {"x": a}) != cache_key("m", "1", {"z": a})
    assert cache_key("m", "1", {"x": a}) != cache_key("m", "2", {"x": a})
    assert cache_key("m", "1", {"x": a}) == cache_key("m", "1", {"x": a.reshape(2, 2)})


def _response(nbytes: int) -> InferResponse:
    return InferResponse("m", "1", "", {"o": np.zeros(nbytes, np.uint8)}, {"o": "UINT8"})


def test_lru_eviction_and_oversized_entries() -> None:
    cache = ResponseCache(size_bytes=300)
    assert cache.insert("k1", _response(100))
    assert cache.insert("k2", _response(100))
    assert cache.lookup("k1") is not None  # k1 is now most recent
    assert cache.insert("k3", _response(100))  # evicts k2 (least recent)
    assert cache.lookup("k2") is None
    assert cache.lookup("k1") is not None and cache.lookup("k3") is not None
    assert cache.evictions == 1
    assert not cache.insert("huge", _response(1000)), "larger than the whole cache"
    assert not cache.insert("k1", _response(10)), "already present"
    gauges = cache.gauges()
    assert gauges["nv_cache_num_evictions"] == 1
    assert 0 < gauges["nv_cache_util"] <= 1


def test_cache_hit_with_preserve_ordering(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "c",
        identity_config(
            "c",
            "response_cache { enable: true }\ndynamic_batching { preserve_ordering: true }",
        ),
    )
    server = make_server(models=("c",), cache_size_bytes=1 << 20)
    server.infer_sync(request("c", 9.0), 10)
    col = Collector()
    slow = InferRequest(
        "c",
        id="slow",
        inputs={"INPUT0": np.zeros((1, 4), np.float32)},
        parameters={"execute_delay_ms": 200},
    )
    server.submit(slow, col.callback("slow"))
    # Once "slow" is in a batch it holds a response slot; a later hit must wait for it.
    wait_until(
        lambda: metric(server, 'nv_inference_pending_request_count{model="c",version="1"}') == 0,
        10,
        "the slow request left the queue (it executes)",
    )
    server.submit(request("c", 9.0, "hit"), col.callback("hit"))
    col.wait(2)
    assert col.order == ["slow", "hit"], "a hit waits for earlier slots"
