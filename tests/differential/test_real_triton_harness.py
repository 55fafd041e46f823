"""The real-Triton harness itself: start/stop, model writing, delay knobs, repository API."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from analyzer.target.supervise import group_members
from tests.support.differential import settled_stats
from tests.support.real_triton import (
    RealTriton,
    TensorSpec,
    TritonInstall,
    _mapped_shm_regions,
    dynamic_batching,
    sleep_model_config,
)

pytestmark = pytest.mark.triton


def _infer(url: str, model: str, batch: int = 1, name: str = "INPUT0") -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    try:
        data = np.arange(batch * 16, dtype=np.float32).reshape(batch, 16)
        tensor = httpclient.InferInput(name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer(model, [tensor]).as_numpy(name.replace("INPUT", "OUTPUT"))
        assert result is not None
        np.testing.assert_array_equal(result, data)
        return result
    finally:
        client.close()


def test_session_server_serves_identity_on_loopback(real_triton: RealTriton) -> None:
    assert real_triton.http_url.startswith("127.0.0.1:")
    _infer(real_triton.http_url, "identity", batch=3)
    stats = settled_stats(real_triton, "identity", successes=1, items=3)
    assert stats["inference_count"] >= 3
    assert 'nv_inference_count{model="identity",version="1"}' in real_triton.metrics_text()


def test_execute_delay_parameters_reach_the_model(real_triton: RealTriton) -> None:
    # 50 ms per execution + 20 ms per batch item: a bs=4 request computes >= 130 ms.
    config = sleep_model_config(
        "harness_delay", execute_delay_ms=50, execute_delay_ms_per_item=20, max_batch_size=8
    )
    real_triton.add_model(config)
    real_triton.load_model("harness_delay")
    _infer(real_triton.http_url, "harness_delay", batch=4)
    stats = settled_stats(real_triton, "harness_delay", successes=1, items=4)
    infer_ns = stats["inference_stats"]["compute_infer"]["ns"]
    assert infer_ns >= 130e6


def test_config_override_reloads_with_new_instances_and_batching(real_triton: RealTriton) -> None:
    real_triton.add_model(sleep_model_config("harness_override"))
    real_triton.load_model("harness_override")
    override = sleep_model_config(
        "harness_override",
        instance_count=2,
        dynamic_batching=dynamic_batching(preferred=[4], max_queue_delay_us=500),
    )
    real_triton.load_model("harness_override", override)
    status, body = real_triton.http_status("GET", "/v2/models/harness_override/config")
    assert status == 200
    config = json.loads(body)
    assert config["instance_group"][0]["count"] == 2
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500


def test_load_failure_carries_tritons_message(real_triton: RealTriton) -> None:
    with pytest.raises(RuntimeError, match="failed to poll from model repository"):
        real_triton.load_model("harness_no_such_model")


def test_delay_scheduler_holds_the_batcher_until_n_requests(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    # Three bs=1 requests, D = 0, preferred [8]: without the hook the first would run alone.
    config = sleep_model_config(
        "held", max_batch_size=8, dynamic_batching=dynamic_batching(), execute_delay_ms=10
    )
    with RealTriton(triton_install, tmp_path, models=[config], delay_scheduler=3) as triton:
        threads = [
            threading.Thread(target=_infer, args=(triton.http_url, "held")) for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        stats = settled_stats(triton, "held", successes=3, items=3)
    assert stats["execution_count"] == 1
    assert [b["batch_size"] for b in stats["batch_stats"]] == [3]


def test_stop_kills_server_and_stub_processes(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    triton = RealTriton(
        triton_install, tmp_path, models=[sleep_model_config("m", instance_count=2)]
    )
    triton.start()
    pid = triton.pid
    assert pid is not None
    regions = _mapped_shm_regions(pid)
    assert len(regions) == 2  # one shared-memory region per stub process
    triton.stop()
    assert not group_members(pid)  # the whole group (server + stubs) is gone: zombies at most
    assert triton.http_status("GET", "/v2/health/live")[0] == 0
    assert not [region for region in regions if region.exists()]


def test_bytes_inputs_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="numpy 2"):
        sleep_model_config("b", inputs=[TensorSpec(data_type="TYPE_STRING")])


def test_start_retries_when_a_picked_port_is_taken(
    triton_install: TritonInstall, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Triton logs "failed to start Metrics service" and keeps running when its metrics port is
    # taken; the harness must notice and start again on other ports.
    import socket

    import tests.support.real_triton as real_triton_module

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy = squatter.getsockname()[1]
        picks = real_triton_module._distinct_free_ports
        calls: list[int] = []

        def first_pick_collides(count: int) -> list[int]:
            ports = picks(count)
            if not calls:
                ports[2] = busy
            calls.append(count)
            return ports

        monkeypatch.setattr(real_triton_module, "_distinct_free_ports", first_pick_collides)
        with RealTriton(triton_install, tmp_path, models=[sleep_model_config("m")]) as triton:
            assert len(calls) == 2
            assert triton.metrics_port != busy
            assert "nv_inference_count" in triton.metrics_text()


def test_sleep_model_echoes_several_inputs_of_other_types(real_triton: RealTriton) -> None:
    config = sleep_model_config(
        "harness_types",
        max_batch_size=4,
        inputs=(
            TensorSpec("INPUT0", dims=(3,), data_type="TYPE_INT32"),
            TensorSpec("INPUT1", dims=(-1,), data_type="TYPE_FP16"),
        ),
    )
    real_triton.add_model(config)
    real_triton.load_model("harness_types")
    ints = np.array([[1, -2, 3], [4, 5, -6]], dtype=np.int32)
    halves = np.array([[0.5, 1.5, -2.0, 8.0, 0.25]] * 2, dtype=np.float16)
    client = httpclient.InferenceServerClient(real_triton.http_url)
    try:
        inputs = [
            httpclient.InferInput("INPUT0", list(ints.shape), "INT32"),
            httpclient.InferInput("INPUT1", list(halves.shape), "FP16"),
        ]
        inputs[0].set_data_from_numpy(ints)
        inputs[1].set_data_from_numpy(halves)
        result = client.infer("harness_types", inputs)
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ints)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), halves)
