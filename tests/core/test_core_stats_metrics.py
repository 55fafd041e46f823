"""Statistics JSON (§7) and Prometheus exposition (§8) after planted traffic."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from reference_server.core.server import CoreOptions, InferenceServer
from tests.core.conftest import (
    Collector,
    ServerFactory,
    identity_config,
    metric,
    pending,
    request,
    wait_until,
    write_model,
)

INFERENCE_KEYS = [
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
]


def test_fresh_model_statistics_shape(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",))
    (stats,) = server.model_statistics("a")["model_stats"]
    assert stats == {
        "name": "a",
        "version": "1",
        "last_inference": 0,
        "inference_count": 0,
        "execution_count": 0,
        "inference_stats": {k: {"count": 0, "ns": 0} for k in INFERENCE_KEYS},
        "response_stats": {},
        "batch_stats": [],
        "memory_usage": [],
    }
    assert list(stats["inference_stats"]) == INFERENCE_KEYS


def test_batched_statistics_and_metrics_agree(tmp_path: Path, make_server: ServerFactory) -> None:
    # bs1 + bs8... (spec §7 example scaled): 1 + 7 and 1 + 1 queued -> two executions.
    write_model(
        tmp_path,
        "a",
        identity_config(
            "a",
            "dynamic_batching { max_queue_delay_microseconds: 200000 }\n"
            'parameters { key: "execute_delay_ms" value { string_value: "5" } }\n'
            'metric_tags { key: "team" value: "perf" }',
        ),
    )
    server = make_server(models=("a",), delay_scheduler=4)
    col = Collector()
    for i, bs in enumerate([1, 7, 1, 1]):
        server.submit(request("a", float(i), str(i), batch=bs), col.callback(str(i)))
    col.wait(4)
    (stats,) = server.model_statistics("a")["model_stats"]
    inf = stats["inference_stats"]
    assert stats["inference_count"] == 10
    assert stats["execution_count"] == 2
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (2, 1),
        (8, 1),
    ]
    assert inf["success"]["count"] == 4 == inf["queue"]["count"] == inf["compute_infer"]["count"]
    assert inf["compute_infer"]["ns"] >= 2 * 2 * 5_000_000, "two 5 ms executions, per request"
    assert inf["success"]["ns"] >= inf["queue"]["ns"]
    assert stats["last_inference"] > 1_600_000_000_000

    text = server.metrics_text()
    # labels are sorted alphabetically: _team < model < version
    labels = '_team="perf",model="a",version="1"'
    assert f"nv_inference_request_success{{{labels}}} 4" in text
    assert f"nv_inference_count{{{labels}}} 10" in text
    assert f"nv_inference_exec_count{{{labels}}} 2" in text
    queue_us = metric(server, f"nv_inference_queue_duration_us{{{labels}}}")
    assert abs(queue_us - inf["queue"]["ns"] / 1000) <= 4, "same events, µs per observation"
    assert "_total" not in text
    assert "# TYPE nv_inference_request_success counter" in text
    assert "# TYPE nv_inference_pending_request_count gauge" in text
    assert (
        "# HELP nv_inference_count Number of inferences performed (does not include cached requests)"
        in text
    )
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert (
            f'nv_inference_request_failure{{_team="perf",model="a",reason="{reason}",version="1"}} 0'
            in text
        )
    # Every sample line is "name{labels} integer" for these counters.
    for line in text.splitlines():
        if line.startswith("nv_inference_count"):
            assert re.fullmatch(r"nv_inference_count\{[^}]*\} \d+", line)


@pytest.mark.usefixtures("takes_seconds")
def test_pending_gauge_rises_and_returns_to_zero(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",))
    server.pause_device("a", 1.0)
    col = Collector()
    server.submit(request("a", 0.0, "0"), col.callback("0"))
    for i in range(1, 4):
        server.submit(request("a", float(i), str(i)), col.callback(str(i)))
    wait_until(
        lambda: pending(server, "a") == 3, 10, "three requests wait behind the paused one"
    )  # one executing (paused), three waiting
    col.wait(4)
    assert pending(server, "a") == 0


def test_series_appear_on_load_and_vanish_on_unload(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=())
    assert "model=" not in server.metrics_text()
    server.load_model("a")
    assert 'nv_inference_request_success{model="a",version="1"} 0' in server.metrics_text()
    server.unload_model("a")
    assert 'model="a"' not in server.metrics_text()


def test_registry_is_per_server(tmp_path: Path) -> None:
    write_model(tmp_path, "a", identity_config("a"))
    registry = CollectorRegistry()
    one = InferenceServer(
        CoreOptions(model_repositories=(tmp_path,), startup_models=("a",)), registry
    )
    two = InferenceServer(CoreOptions(model_repositories=(tmp_path,), startup_models=("a",)))
    one.start()
    two.start()
    try:
        assert one.registry is registry and two.registry is not registry
        one.infer_sync(request("a", 1.0), 10)
        assert metric(one, 'nv_inference_request_success{model="a",version="1"}') == 1
        assert metric(two, 'nv_inference_request_success{model="a",version="1"}') == 0
    finally:
        one.stop()
        two.stop()


def test_histogram_latencies_option(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "a",
        identity_config(
            "a", 'parameters { key: "execute_delay_ms" value { string_value: "120" } }'
        ),
    )
    server = make_server(models=("a",), metrics_histogram_latencies=True)
    server.infer_sync(request("a", 1.0), 10)
    server.infer_sync(request("a", 2.0), 10)
    text = server.metrics_text()
    name = "nv_inference_first_response_histogram_ms"
    assert f"# TYPE {name} histogram" in text
    # Each request took >= 120 ms: both land above the 100 ms bucket.
    assert f'{name}_bucket{{model="a",version="1",le="100"}} 0' in text
    assert f'{name}_bucket{{model="a",version="1",le="+Inf"}} 2' in text
    assert f'{name}_count{{model="a",version="1"}} 2' in text
    assert metric(server, f'{name}_sum{{model="a",version="1"}}') >= 240


def test_counter_latencies_off_freezes_all_counters(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",), metrics_counter_latencies=False)
    server.infer_sync(request("a", 1.0), 10)
    assert metric(server, 'nv_inference_request_success{model="a",version="1"}') == 0
    assert metric(server, 'nv_inference_count{model="a",version="1"}') == 0
    assert "nv_inference_first_response_histogram_ms" not in server.metrics_text()
    stats = server.model_statistics("a")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 1, "statistics are unaffected"


def test_device_info_metric_names_what_each_instance_runs_on(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    from reference_server.zoo.resnet50 import make_repository

    make_repository(tmp_path, device="sim")
    server = make_server(models=("resnet50",))
    text = server.metrics_text()
    lines = [line for line in text.splitlines() if line.startswith("perfsweep_model_device_info{")]
    assert len(lines) == 1, text
    labels = dict(re.findall(r'(\w+)="([^"]*)"', lines[0]))
    assert labels["model"] == "resnet50" and labels["version"] == "1"
    assert labels["backend"] == "simulated" and labels["profile"] == "resnet50_sim"
    assert labels["instance"] == "resnet50_0_0"
    assert lines[0].endswith(" 1")
    assert "# TYPE perfsweep_model_device_info gauge" in text
    # Triton's own families are unchanged: the info metric is one extra family.
    assert 'nv_inference_request_success{model="resnet50",version="1"} 0' in text
