"""The reference server loads a two-group config the sweep writes, and runs the instances
Triton would (a KIND_GPU group's count on each listed GPU)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.model_config import apply_knobs, knobs_of
from analyzer.config.scenario import load_scenario
from analyzer.sweep.loop import space_for
from analyzer.target.protocol import read_device_info
from analyzer.target.remote import RemoteTarget
from tests.support.real_triton import dynamic_batching, sleep_model_config
from tests.support.servers import ReferenceServer

pytestmark = pytest.mark.usefixtures("serves")


def _model() -> mc.ModelConfig:
    config = sleep_model_config("m", dynamic_batching=dynamic_batching())
    del config.instance_group[:]
    gpu = config.instance_group.add(name="gpu", kind=mc.ModelInstanceGroup.KIND_GPU, count=1)
    gpu.gpus.extend([0, 1])
    config.instance_group.add(name="cpu", kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    return config


def test_the_server_loads_a_two_group_config_of_the_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = load_scenario(
        None, {"space.instance_count": [1, 2], "space.max_batch_size": [1, 8]}, env={}
    )
    # Two GPUs the in-process server believes it has: it checks the GPU list as Triton does,
    # and the identity backend runs on any device.
    monkeypatch.setattr("reference_server.core.server.detect_gpus", lambda: (0, 1))
    with ReferenceServer(tmp_path, [_model()]) as server:
        target = RemoteTarget(server.http_url, "m")
        target.start()
        base = target.model_config()
        assert knobs_of(base).group_counts == (1, 1)
        assert knobs_of(base).instance_count == 3
        space = space_for(scenario, base)
        assert {"instances_0", "instances_1"} <= set(space.param_bounds())
        knobs = space.decode({"log2_mbs": 3, "instances_0": 2, "instances_1": 1})
        assert (knobs.instance_count, knobs.group_counts) == (5, (2, 1))
        target.load_config(apply_knobs(base, knobs))
        served = target.model_config()
        assert knobs_of(served) == knobs
        assert [(g.name, list(g.gpus), g.count) for g in served.instance_group] == [
            ("gpu", [0, 1], 2),
            ("cpu", [], 1),
        ]
        instances = read_device_info(server.metrics_url, "m")
        assert Counter(i["kind"] for i in instances) == {"KIND_GPU": 4, "KIND_CPU": 1}
