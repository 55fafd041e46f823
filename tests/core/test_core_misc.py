"""Smaller facade features: rate-limit option, classification, file overrides, add_sub, env."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reference_server.core.config import config_to_json
from reference_server.core.errors import ServerError
from reference_server.core.server import CoreOptions, InferenceServer, delay_scheduler_from_env
from reference_server.core.types import InferRequest, RequestedOutput
from tests.core.conftest import ServerFactory, identity_config, request, write_model

RATE_LIMITED = (
    "instance_group [{ count: 1 kind: KIND_CPU "
    'rate_limiter { resources [{ name: "R" count: 1 }] } }]'
)


def test_rate_limiter_ignored_by_default(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(tmp_path, "r", identity_config("r", RATE_LIMITED))
    server = make_server(models=("r",))
    assert server.infer_sync(request("r", 1.0), 10).outputs["OUTPUT0"].tolist() == [[1.0] * 4]


def test_rate_limiter_honoured_when_asked_for(tmp_path: Path, make_server: ServerFactory) -> None:
    # --rate-limit=execution_count loads and serves a model that declares resources (R gets
    # the capacity its only user asks for) and one that declares none.
    write_model(tmp_path, "r", identity_config("r", RATE_LIMITED))
    write_model(tmp_path, "plain", identity_config("plain"))
    server = make_server(models=(), rate_limit="execution_count")
    server.load_model("r")
    server.load_model("plain")
    assert server.rate_limiter is not None
    assert server.rate_limiter.capacity("R", 0) == 1
    for model in ("r", "plain"):
        assert server.infer_sync(request(model, 2.0), 10).outputs["OUTPUT0"].tolist() == [[2.0] * 4]


def test_unknown_rate_limit_mode_refused(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="invalid argument for --rate-limit"):
        InferenceServer(CoreOptions(model_repositories=(tmp_path,), rate_limit="sometimes"))  # type: ignore[arg-type]


def test_classification_top_k(tmp_path: Path, make_server: ServerFactory) -> None:
    model_dir = write_model(
        tmp_path,
        "cls",
        identity_config("cls").replace(
            "dims: [ 4 ] }\n\n", 'dims: [ 4 ] label_filename: "labels.txt" }\n'
        ),
    )
    (model_dir / "labels.txt").write_text("zero\none\ntwo\nthree\n")
    server = make_server(models=("cls",))
    req = InferRequest(
        "cls",
        inputs={"INPUT0": np.array([[0.5, 3.0, 1.0, 2.0]], np.float32)},
        requested_outputs=[RequestedOutput("OUTPUT0", class_count=2)],
    )
    out = server.infer_sync(req, 10)
    assert out.output_datatypes == {"OUTPUT0": "BYTES"}
    assert out.outputs["OUTPUT0"].tolist() == [[b"3.000000:1:one", b"2.000000:3:three"]]


def test_requested_output_subset_and_unknown(tmp_path: Path, make_server: ServerFactory) -> None:
    config = """
name: "as"
backend: "add_sub"
max_batch_size: 4
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 3 ] }
input { name: "INPUT1" data_type: TYPE_INT32 dims: [ 3 ] }
output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 3 ] }
output { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 3 ] }
"""
    write_model(tmp_path, "as", config)
    server = make_server(models=("as",))
    a = np.array([[5, 6, 7]], np.int32)
    b = np.array([[1, 2, 3]], np.int32)
    full = server.infer_sync(InferRequest("as", inputs={"INPUT0": a, "INPUT1": b}), 10)
    assert list(full.outputs) == ["OUTPUT0", "OUTPUT1"]
    assert full.outputs["OUTPUT1"].tolist() == [[4, 4, 4]]
    sub = server.infer_sync(
        InferRequest(
            "as",
            inputs={"INPUT0": a, "INPUT1": b},
            requested_outputs=[RequestedOutput("OUTPUT1")],
        ),
        10,
    )
    assert list(sub.outputs) == ["OUTPUT1"]
    with pytest.raises(ServerError, match="unexpected inference output 'NOPE' for model 'as'"):
        server.infer_sync(
            InferRequest(
                "as",
                inputs={"INPUT0": a, "INPUT1": b},
                requested_outputs=[RequestedOutput("NOPE")],
            ),
            10,
        )
    with pytest.raises(ServerError, match="missing required input"):
        server.infer_sync(InferRequest("as", inputs={"INPUT0": a}), 10)


def test_load_with_files_forms_its_own_model_directory(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(tmp_path, "a", identity_config("a"))
    server = make_server(models=("a",))
    cfg = config_to_json(server.model_config("a"))
    cfg["version_policy"] = {"specific": {"versions": [2]}}
    server.load_model("a", config_json=json.dumps(cfg), files={"file:2/notes.txt": b"hello"})
    assert server.model_metadata("a")["versions"] == ["2"]
    with pytest.raises(ServerError, match="model config must be provided"):
        server.load_model("a", files={"file:1/x": b""})


def test_unknown_backend_refused(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(tmp_path, "x", identity_config("x").replace('"identity"', '"tensorrt"'))
    server = make_server(models=())
    with pytest.raises(ServerError, match="unable to find backend library for backend 'tensorrt'"):
        server.load_model("x")
    assert server.repository_index()[0]["state"] == "UNAVAILABLE"


def test_delay_scheduler_env_is_read_at_the_edge() -> None:
    assert delay_scheduler_from_env({"TRITONSERVER_DELAY_SCHEDULER": "6"}) == 6
    assert delay_scheduler_from_env({}) == 0
    assert delay_scheduler_from_env({"TRITONSERVER_DELAY_SCHEDULER": "x"}) == 0


def test_failing_callback_does_not_stop_the_model(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    write_model(tmp_path, "a", identity_config("a", "dynamic_batching {}"))
    server = make_server(models=("a",))

    def explode(result: object) -> None:
        raise RuntimeError("frontend bug")

    server.submit(request("a", 1.0), explode)
    out = server.infer_sync(request("a", 2.0), 10)
    assert out.outputs["OUTPUT0"].tolist() == [[2.0] * 4]


def test_same_model_in_two_repositories(tmp_path: Path) -> None:
    from reference_server.core.server import CoreOptions, InferenceServer

    for repo in ("r1", "r2"):
        write_model(tmp_path / repo, "dup", identity_config("dup"))
    server = InferenceServer(
        CoreOptions(model_repositories=(tmp_path / "r1", tmp_path / "r2"), startup_models=("dup",))
    )
    server.start()
    try:
        assert server.repository_index() == [
            {
                "name": "dup",
                "version": "1",
                "state": "UNAVAILABLE",
                "reason": "model appears in two or more repositories",
            }
        ]
    finally:
        server.stop()
