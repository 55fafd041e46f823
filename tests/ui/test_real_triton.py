"""The dashboard against a real Triton (pytriton's ``tritonserver``): same numbers as Triton's
own statistics and metrics, and a config change applied with Triton's repository API; the config
form refuses ensembles and sequence-batched models (pushing dynamic_batching would erase their
scheduling: one proto oneof)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from tests.support.real_triton import RealTriton, identity_model_config, sleep_model_config
from tests.ui.support import http, quiet_truth, start_ui, wait_agreement, wait_until

pytestmark = [pytest.mark.triton, pytest.mark.timeout(300)]

MODEL = "ui_identity"  # our own model on the shared server: nobody else sends it requests


def test_dashboard_on_real_triton(real_triton: RealTriton, tmp_path: Path) -> None:
    real_triton.add_model(identity_model_config(MODEL, max_queue_delay_us=500))
    real_triton.load_model(MODEL)
    child, base = start_ui(
        tmp_path, real_triton.base_url, MODEL, real_triton.grpc_url, real_triton.metrics_url
    )
    try:
        form = {
            "user_count": 4,
            "spawn_rate": 4,
            "user_classes": ["TritonHttpUser", "TritonGrpcUser"],
        }
        assert http("POST", base + "/swarm", form=form)[1]["success"]

        def doc() -> dict[str, Any]:
            return http("GET", base + "/perfsweep/server")[1]

        seen = wait_until(
            lambda: (
                (d := doc())["client"]["window"]["requests"] >= 200
                and (d.get("server") or {}).get("window", {}).get("execution_count", 0) > 0
                and d
            ),
            90,
            "traffic seen by the dashboard",
        )
        assert seen["client"]["window"]["errors"] == 0
        assert seen["server"]["window"]["avg_batch_size"] >= 1.0

        # A config change through the dashboard, while the load runs.
        status, answer = http(
            "POST",
            base + "/perfsweep/config",
            body={"max_queue_delay_us": 2000, "preferred_batch_size": [4], "instance_count": 2},
        )
        assert status == 200, answer
        _, config = http("GET", f"{real_triton.base_url}/v2/models/{MODEL}/config")
        assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 2000
        assert [int(s) for s in config["dynamic_batching"]["preferred_batch_size"]] == [4]
        assert sum(int(g["count"]) for g in config["instance_group"]) == 2
        wait_until(lambda: doc()["server_reloads"] >= 1, 30, "the dashboard to see the reload")

        assert http("POST", base + "/stop")[0] == 200
        truth = quiet_truth(real_triton.base_url, real_triton.metrics_url, MODEL)
        wait_agreement(base, truth)
    finally:
        child.stop()


def _sequence_model(triton: RealTriton) -> str:
    config = sleep_model_config("ui_stateful", max_batch_size=8)
    config.sequence_batching.max_sequence_idle_microseconds = 5_000_000
    triton.add_model(config)
    triton.load_model("ui_stateful")
    return "ui_stateful"


def _ensemble_model(triton: RealTriton) -> str:
    inner = identity_model_config("ui_inner")
    triton.add_model(inner)
    triton.load_model("ui_inner")
    ensemble = mc.ModelConfig(name="ui_ensemble", platform="ensemble", max_batch_size=8)
    ensemble.input.extend(inner.input)
    ensemble.output.extend(inner.output)
    step = ensemble.ensemble_scheduling.step.add(model_name="ui_inner", model_version=-1)
    step.input_map["INPUT0"] = inner.input[0].name
    step.output_map["OUTPUT0"] = inner.output[0].name
    triton.add_model(ensemble, model_source="")
    triton.load_model("ui_ensemble")
    return "ui_ensemble"


@pytest.mark.parametrize(
    ("make", "needle"),
    [(_sequence_model, "sequence-batched"), (_ensemble_model, "an ensemble")],
    ids=["sequence", "ensemble"],
)
def test_config_form_refuses_models_it_would_corrupt(
    real_triton: RealTriton, tmp_path: Path, make: Callable[[RealTriton], str], needle: str
) -> None:
    model = make(real_triton)
    config_url = f"{real_triton.base_url}/v2/models/{model}/config"
    status, before = http("GET", config_url)
    assert status == 200, before
    child, base = start_ui(
        tmp_path, real_triton.base_url, model, real_triton.grpc_url, real_triton.metrics_url
    )
    try:
        status, answer = http("POST", base + "/perfsweep/config", body={"max_queue_delay_us": 2000})
    finally:
        child.stop()
    assert status == 400, answer
    assert answer["ok"] is False
    assert needle in answer["error"] and "tune" in answer["error"], answer["error"]
    assert http("GET", config_url) == (200, before)  # nothing was loaded
