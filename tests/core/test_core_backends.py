"""Real backends through the facade: onnxruntime (tiny graph and ResNet-50), simulated device."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from reference_server.backends.onnxruntime import choose_providers
from reference_server.core.errors import Code, ServerError
from reference_server.core.types import InferRequest
from reference_server.zoo.profiles import LatencyCurve, bundled_profiles, resolve_profile
from reference_server.zoo.resnet50 import make_repository
from tests.core.conftest import Collector, ServerFactory, batch_stats, write_model

ADD_ONE = """
name: "add1"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }
instance_group [{ count: 1 kind: KIND_CPU }]
dynamic_batching { max_queue_delay_microseconds: 100000 }
parameters { key: "intra_op_threads" value { string_value: "1" } }
"""


def write_add_one(root: Path, config: str = ADD_ONE, width: int = 4) -> None:
    """A tiny ONNX graph y = x + 1 over [batch, width] (the ONNX side fixes width)."""
    model_dir = write_model(root, "add1", config)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "add1",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(model_dir / "1" / "model.onnx"))


def test_onnxruntime_batches_concatenate_and_split(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_add_one(tmp_path)
    server = make_server(models=("add1",), delay_scheduler=3)
    col = Collector()
    for i, bs in enumerate([1, 3, 2]):
        x = np.arange(bs * 4, dtype=np.float32).reshape(bs, 4) + 100 * i
        server.submit(InferRequest("add1", id=str(i), inputs={"x": x}), col.callback(str(i)))
    col.wait(3)
    assert batch_stats(server, "add1") == {6: 1}, "one session.run for the whole batch"
    for i, bs in enumerate([1, 3, 2]):
        out = col.results[str(i)]
        assert not isinstance(out, Exception)
        expected = np.arange(bs * 4, dtype=np.float32).reshape(bs, 4) + 100 * i + 1
        np.testing.assert_array_equal(out.outputs["y"], expected)
        assert out.output_datatypes == {"y": "FP32"}
    (info,) = server.device_info("add1")
    assert info["provider"] == "CPUExecutionProvider" and info["device"] == "cpu"
    assert server.model_metadata("add1")["platform"] == "onnxruntime_onnx"


def test_onnxruntime_failure_fails_the_batch_as_backend(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    # The config accepts any width but the graph needs 4: onnxruntime raises at run time.
    write_add_one(tmp_path, ADD_ONE.replace("dims: [ 4 ]", "dims: [ -1 ]"))
    server = make_server(models=("add1",))
    col = Collector()
    server.submit(
        InferRequest("add1", id="w", inputs={"x": np.zeros((1, 5), np.float32)}), col.callback("w")
    )
    col.wait(1)
    err = col.results["w"]
    assert isinstance(err, ServerError) and err.code is Code.INTERNAL
    text = server.metrics_text()
    assert 'nv_inference_request_failure{model="add1",reason="BACKEND",version="1"} 1' in text
    stats = server.model_statistics("add1")["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 1 and stats["success"]["count"] == 0


def test_onnxruntime_missing_file_refuses_load(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(tmp_path, "add1", ADD_ONE)
    server = make_server(models=())
    with pytest.raises(
        ServerError,
        match="load failed for model 'add1': version 1 is at UNAVAILABLE state: Internal: unable",
    ):
        server.load_model("add1")


def test_provider_choice() -> None:
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert choose_providers("auto", "KIND_GPU", 1, cuda)[0] == (
        "CUDAExecutionProvider",
        {"device_id": "1"},
    )
    assert choose_providers("auto", "KIND_CPU", 0, cuda) == ["CPUExecutionProvider"]
    assert choose_providers("cpu", "KIND_GPU", 0, cuda) == ["CPUExecutionProvider"]
    assert choose_providers("cuda", "KIND_GPU", 0, ["CPUExecutionProvider"]) == [
        "CPUExecutionProvider"
    ]


def test_resnet50_builds_and_runs_a_batch_of_two(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    make_repository(tmp_path, device="cpu")
    server = make_server(models=("resnet50",))
    cfg = server.model_config("resnet50")
    assert cfg.max_batch_size == 32 and not cfg.HasField("dynamic_batching")
    assert [g.count for g in cfg.instance_group] == [1]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 224, 224), dtype=np.float32)
    out = server.infer_sync(InferRequest("resnet50", inputs={"input": x}), timeout_s=120)
    logits = out.outputs["output"]
    assert logits.shape == (2, 1000) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    assert not np.allclose(logits[0], logits[1]), "different images, different logits"
    assert server.device_info("resnet50")[0]["provider"] == "CPUExecutionProvider"
    assert batch_stats(server, "resnet50") == {2: 1}


# ------------------------------------------------------------------ simulated device

SIM = """
name: "{name}"
backend: "simulated"
max_batch_size: 32
input {{ name: "input" data_type: TYPE_FP32 dims: [ 3 ] }}
output {{ name: "output" data_type: TYPE_FP32 dims: [ 10 ] }}
instance_group [{{ count: 2 kind: KIND_CPU }}]
parameters {{ key: "profile" value {{ string_value: "slow.toml" }} }}
parameters {{ key: "sim_device" value {{ string_value: "{device}" }} }}
"""

SLOW_PROFILE = """
name = "slow"
provenance = "synthetic test profile"
jitter = 0.0
[device]
a_ms = 40.0
[host_pre]
a_ms = 20.0
"""


def _device_windows(server, model: str, n: int) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    col = Collector()
    reqs = []
    for i in range(n):
        req = InferRequest(model, id=str(i), inputs={"input": np.zeros((1, 3), np.float32)})
        reqs.append(req)
        server.submit(req, col.callback(str(i)))
    col.wait(n)
    for i in range(n):
        out = col.results[str(i)]
        assert not isinstance(out, Exception)
        assert out.outputs["output"].shape == (1, 10)
    return sorted((r.compute_input_end_ns, r.compute_output_start_ns) for r in reqs)


def _overlaps(windows: list[tuple[int, int]]) -> int:
    return sum(1 for a, b in itertools.pairwise(windows) if b[0] < a[1])


def test_instances_on_one_simulated_gpu_serialise_device_work(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    for name, device in (("shared", "gpu-a"), ("split_a", "gpu-b"), ("split_b", "gpu-c")):
        model_dir = write_model(tmp_path, name, SIM.format(name=name, device=device))
        (model_dir / "slow.toml").write_text(SLOW_PROFILE)
    # Two models on different devices vs two instances of one model on one device.
    server = make_server(models=("shared", "split_a", "split_b"))
    shared = _device_windows(server, "shared", 4)
    assert _overlaps(shared) == 0, "device time never overlaps on one device"
    # Device windows of the two devices may overlap when both are driven at once.
    col = Collector()
    reqs = []
    for i, model in enumerate(["split_a", "split_b"] * 2):
        req = InferRequest(model, id=str(i), inputs={"input": np.zeros((1, 3), np.float32)})
        reqs.append(req)
        server.submit(req, col.callback(str(i)))
    col.wait(4)
    windows = sorted((r.compute_input_end_ns, r.compute_output_start_ns) for r in reqs)
    assert _overlaps(windows) >= 1, "separate simulated GPUs work in parallel"
    # The split is visible in statistics: compute_infer holds the device time (>= 40 ms).
    stats = server.model_statistics("shared")["model_stats"][0]["inference_stats"]
    assert stats["compute_infer"]["ns"] >= 4 * 40_000_000
    assert stats["compute_input"]["ns"] >= 4 * 20_000_000


def test_pause_device_holds_executions(tmp_path: Path, make_server: ServerFactory) -> None:
    make_repository(tmp_path, device="sim")
    server = make_server(models=("resnet50",))
    server.pause_device("resnet50", 0.3)
    start = time.monotonic()
    out = server.infer_sync(
        InferRequest("resnet50", inputs={"input": np.zeros((1, 3, 224, 224), np.float32)}), 10
    )
    assert time.monotonic() - start >= 0.29
    assert out.outputs["output"].shape == (1, 1000)
    info = server.device_info("resnet50")[0]
    assert info["backend"] == "simulated" and "SYNTHETIC" in info["provenance"]


def test_bundled_profiles_and_curves() -> None:
    assert {"resnet50_sim", "sim_linear"} <= set(bundled_profiles())
    sim = resolve_profile("resnet50_sim")
    assert sim.provenance.startswith("SYNTHETIC")
    assert sim.device.ms(1) == pytest.approx(10.0)
    assert sim.device.ms(8) == pytest.approx(22.5)
    assert sim.device.ms(12) == pytest.approx(32.5)  # interpolated between 8 and 16
    one, big = sim.throughput_per_s(1), sim.throughput_per_s(32)
    assert big > 3 * one, "batching pays on the simulated GPU"
    assert big <= 450, "well inside what a 2-core load generator offers beside the server"
    lin = resolve_profile("sim_linear")
    assert lin.device.ms(8) == pytest.approx(4.0)
    assert LatencyCurve(points=((1, 2.0), (4, 5.0))).ms(8) == pytest.approx(9.0)
    # Host time overlaps across instances, device time does not: diminishing returns.
    one_inst, two, three = (sim.throughput_per_s(8, instances=n) for n in (1, 2, 3))
    assert 1.1 * one_inst < two == pytest.approx(three) == pytest.approx(8000 / 22.5)
