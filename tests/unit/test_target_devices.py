"""Which device ran: the reference server's ``perfsweep_model_device_info`` series, parsed."""

from __future__ import annotations

from analyzer.target.protocol import observed_device, parse_device_info

METRICS = """\
# HELP perfsweep_model_device_info What each model instance runs on
# TYPE perfsweep_model_device_info gauge
perfsweep_model_device_info{backend="onnxruntime",device="cpu",instance="resnet50_0_0",kind="KIND_CPU",model="resnet50",provider="CPUExecutionProvider",version="1"} 1
perfsweep_model_device_info{backend="onnxruntime",device="cuda",instance="other_0_0",kind="KIND_GPU",model="other",provider="CUDAExecutionProvider",version="1"} 1
nv_inference_count{model="resnet50",version="1"} 3
"""


def test_parse_keeps_only_the_model_asked_for() -> None:
    devices = parse_device_info(METRICS, "resnet50")
    assert devices == [
        {
            "backend": "onnxruntime",
            "device": "cpu",
            "instance": "resnet50_0_0",
            "kind": "KIND_CPU",
            "model": "resnet50",
            "provider": "CPUExecutionProvider",
            "version": "1",
        }
    ]
    assert parse_device_info(METRICS, "absent") == []


def test_observed_device_prefers_the_servers_report() -> None:
    assert observed_device(parse_device_info(METRICS, "resnet50"), "auto") == "cpu"
    assert observed_device(parse_device_info(METRICS, "other"), "auto") == "cuda"
    assert observed_device([{"backend": "simulated", "device": "sim-gpu0"}], "sim") == "sim"
    # A server that does not publish the metric (a real Triton): the requested device stands.
    assert observed_device([], "auto") == "auto"
