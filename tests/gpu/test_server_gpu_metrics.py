"""The reference server's ``nv_gpu_*`` series on its real ``/metrics``, over real sockets.

A simulated model on a simulated GPU with a planted profile (device time only, no jitter, a
``[gpu]`` table with round figures) gives exact memory and power, and a utilisation that must
match the busy share the server's own statistics imply. A CPU-only model gives no GPU series.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from reference_server.app import ServerOptions, ServerThread
from reference_server.core.gpu import GPU_FAMILIES, simulated_uuid
from tests.support.servers import wait_until, write_model

MIB = 1024 * 1024
PROFILE = """
name = "gpu_test"
provenance = "SYNTHETIC test profile: 20 ms of device time per execution, nothing else."
jitter = 0.0
[device]
a_ms = 20.0
[host_pre]
a_ms = 20.0
[gpu]
provenance = "SYNTHETIC round figures for tests."
name = "test GPU"
memory_total_mb = 1000
context_mb = 100
weights_mb = 50
activation_mb_per_item = 10
power_idle_w = 20
power_busy_w = 120
power_limit_w = 150
"""


def sim_config(name: str, instances: int = 2) -> str:
    return f"""
name: "{name}"
backend: "simulated"
max_batch_size: 8
input {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}
output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "profile" value {{ string_value: "gpu_test.toml" }} }}
parameters {{ key: "sim_device" value {{ string_value: "sim-gpu0" }} }}
"""


IDENTITY = """
name: "plain"
backend: "identity"
max_batch_size: 8
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }
"""


@pytest.fixture
def sim_server(tmp_path: Path, serves: None) -> Iterator[ServerThread]:
    write_model(tmp_path, "sim", sim_config("sim"), files={"gpu_test.toml": PROFILE})
    with ServerThread(ServerOptions(model_repositories=(tmp_path,), models=("sim",))) as server:
        yield server


def metrics_text(server: ServerThread) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as resp:
        return str(resp.read().decode())


def gpu_values(text: str) -> dict[str, dict[str, float]]:
    """family -> gpu_uuid -> value (the parser calls a counter's sample ``<name>_total``)."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "gpu_uuid" in s.labels:
                out.setdefault(family.name, {})[s.labels["gpu_uuid"]] = s.value
    return out


def infer(client: httpclient.InferenceServerClient, model: str, batch: int = 1) -> None:
    inp = httpclient.InferInput("INPUT0", [batch, 4], "FP32")
    inp.set_data_from_numpy(np.ones((batch, 4), dtype=np.float32))
    client.infer(model, [inp])


def test_families_types_help_and_label_as_triton(sim_server: ServerThread) -> None:
    text = metrics_text(sim_server)
    for name, typ, help_ in GPU_FAMILIES:
        assert f"# HELP {name} {help_}\n# TYPE {name} {typ}\n" in text
        samples = re.findall(rf"^{name}\{{(.*)\}} (\S+)$", text, re.M)
        assert samples == [(f'gpu_uuid="{simulated_uuid("sim-gpu0")}"', samples[0][1])]
    # Triton prints no _total suffix on its counter.
    assert "nv_energy_consumption_total" not in text
    assert re.search(
        r'^perfsweep_gpu_info\{gpu_uuid="GPU-[0-9a-f-]{36}",name="test GPU \(sim-gpu0\)"\} 1$',
        text,
        re.M,
    )


def test_memory_is_context_plus_weights_per_instance_plus_peak_activations(
    sim_server: ServerThread,
) -> None:
    uid = simulated_uuid("sim-gpu0")
    values = gpu_values(metrics_text(sim_server))
    assert values["nv_gpu_memory_total_bytes"][uid] == 1000 * MIB
    # Two instances loaded, nothing run: context + 2 x weights.
    assert values["nv_gpu_memory_used_bytes"][uid] == (100 + 2 * 50) * MIB
    client = httpclient.InferenceServerClient(sim_server.http_url.split("://")[-1])
    infer(client, "sim", batch=8)  # one instance's arena grows to batch 8
    values = gpu_values(metrics_text(sim_server))
    assert values["nv_gpu_memory_used_bytes"][uid] == (100 + 2 * 50 + 8 * 10) * MIB
    infer(client, "sim", batch=2)  # smaller batches never shrink an arena
    used = gpu_values(metrics_text(sim_server))["nv_gpu_memory_used_bytes"][uid]
    assert used in ((100 + 2 * 50 + 8 * 10) * MIB, (100 + 2 * 50 + 10 * 10) * MIB)
    client.unload_model("sim")

    def released() -> dict | None:
        values = gpu_values(metrics_text(sim_server))
        return values if values["nv_gpu_memory_used_bytes"][uid] == 0 else None

    values = wait_until(released, 10, "the unloaded model's memory to be released")
    # Unloaded: nothing held, the GPU is still reported (Triton reports every GPU it sees).
    assert values["nv_gpu_memory_used_bytes"][uid] == 0
    assert values["nv_gpu_memory_total_bytes"][uid] == 1000 * MIB


def test_models_sharing_a_gpu_add_up_on_it(tmp_path: Path, serves: None) -> None:
    """Two models on one simulated GPU (a mix served together): one context, each instance's
    weights and arena by its own model's [gpu] figures, all on the one device's series (what
    goals.max_gpu_memory_mb bounds: the fullest GPU's peak)."""
    other = PROFILE.replace("weights_mb = 50", "weights_mb = 30").replace(
        "activation_mb_per_item = 10", "activation_mb_per_item = 4"
    )
    write_model(tmp_path, "sim", sim_config("sim"), files={"gpu_test.toml": PROFILE})
    write_model(
        tmp_path,
        "other",
        sim_config("other", instances=1).replace("gpu_test.toml", "other.toml"),
        files={"other.toml": other},
    )
    options = ServerOptions(model_repositories=(tmp_path,), models=("sim", "other"))
    uid = simulated_uuid("sim-gpu0")
    with ServerThread(options) as server:
        values = gpu_values(metrics_text(server))
        assert list(values["nv_gpu_memory_used_bytes"]) == [uid]  # one GPU, not one per model
        assert values["nv_gpu_memory_used_bytes"][uid] == (100 + 2 * 50 + 30) * MIB
        client = httpclient.InferenceServerClient(server.http_url.split("://")[-1])
        infer(client, "other", batch=8)
        infer(client, "sim", batch=4)
        used = gpu_values(metrics_text(server))["nv_gpu_memory_used_bytes"][uid]
        assert used == (100 + 2 * 50 + 30 + 8 * 4 + 4 * 10) * MIB


def test_utilization_is_the_busy_share_the_statistics_imply(sim_server: ServerThread) -> None:
    """One client in a loop: 20 ms host + 20 ms device per request, so about half busy.

    The gauge covers the trailing second; the statistics' compute_infer over the same second is
    the device time (the simulated backend holds the device exactly then).
    """
    uid = simulated_uuid("sim-gpu0")
    address = sim_server.http_url.split("://")[-1]
    stop = threading.Event()

    def loop() -> None:
        client = httpclient.InferenceServerClient(address)
        while not stop.is_set():
            infer(client, "sim")

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    stats = httpclient.InferenceServerClient(address)
    try:

        def infer_ns() -> int:
            doc = stats.get_inference_statistics("sim")
            return int(doc["model_stats"][0]["inference_stats"]["compute_infer"]["ns"])

        wait_until(infer_ns, 30, "the client loop's first executions")
        before, t0 = infer_ns(), time.monotonic()
        time.sleep(1.0)  # the scenario: one second of load, the gauge's trailing interval
        text = metrics_text(sim_server)
        after, t1 = infer_ns(), time.monotonic()
    finally:
        stop.set()
        worker.join(10)
    from_stats = (after - before) / ((t1 - t0) * 1e9)
    values = gpu_values(text)
    util = values["nv_gpu_utilization"][uid]
    assert 0.3 < util < 0.55  # about 20 / (40 + HTTP) ms
    # One 20 ms execution at either edge of the second is 2 %; 5 points is generous.
    assert abs(util - from_stats) < 0.05, (util, from_stats)
    power = values["nv_gpu_power_usage"][uid]
    assert power == pytest.approx(20 + 100 * util, rel=0.1)
    # Idle for longer than the interval: nothing busy in it.
    time.sleep(1.2)  # the scenario: the trailing second holds no execution
    values = gpu_values(metrics_text(sim_server))
    assert values["nv_gpu_utilization"][uid] == 0.0
    assert values["nv_gpu_power_usage"][uid] == 20.0


def test_energy_counter_adds_idle_and_busy_power(sim_server: ServerThread) -> None:
    uid = simulated_uuid("sim-gpu0")
    first = gpu_values(metrics_text(sim_server))["nv_energy_consumption"][uid]
    client = httpclient.InferenceServerClient(sim_server.http_url.split("://")[-1])
    t0 = time.monotonic()
    for _ in range(10):
        infer(client, "sim")  # 10 x 20 ms of device time
    elapsed = time.monotonic() - t0
    second = gpu_values(metrics_text(sim_server))["nv_energy_consumption"][uid]
    # 20 W for the elapsed time plus 100 W more for 0.2 s busy (the scrapes add a little idle).
    expected = 20 * elapsed + 100 * 0.2
    assert expected - 0.5 < second - first < expected + 20 * 0.5


@pytest.mark.usefixtures("serves")
def test_cpu_only_server_prints_no_gpu_series(tmp_path: Path) -> None:
    write_model(tmp_path, "plain", IDENTITY)
    options = ServerOptions(model_repositories=(tmp_path,), models=("plain",), device="cpu")
    with ServerThread(options) as server:
        client = httpclient.InferenceServerClient(server.http_url.split("://")[-1])
        infer(client, "plain")
        text = metrics_text(server)
    assert "nv_inference_request_success" in text
    assert "nv_gpu_" not in text and "nv_energy" not in text and "perfsweep_gpu_info" not in text


def test_memory_grows_with_the_instances_a_reload_asks_for(sim_server: ServerThread) -> None:
    """What the sweep's memory goal rests on: reloading with more instances (the repository
    API's config override, as a trial does) holds one more copy of the weights per instance."""
    import json

    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2 as mc

    from analyzer.rundir.results import parse_config_text

    uid = simulated_uuid("sim-gpu0")
    client = httpclient.InferenceServerClient(sim_server.http_url.split("://")[-1])
    used = {}
    for count in (1, 3):
        config: mc.ModelConfig = parse_config_text(sim_config("sim", instances=count))
        override = json_format.MessageToDict(config, preserving_proto_field_name=True)
        client.load_model("sim", config=json.dumps(override))
        # As in Triton, the load returns once the new instances are ready; the old ones drain
        # and release their memory on a background thread after it. Read once that is done.
        expected = (100 + count * 50) * MIB
        deadline = time.monotonic() + 10.0
        while True:
            used[count] = gpu_values(metrics_text(sim_server))["nv_gpu_memory_used_bytes"][uid]
            if used[count] <= expected or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert used[1] == (100 + 1 * 50) * MIB
    assert used[3] == (100 + 3 * 50) * MIB
