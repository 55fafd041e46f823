"""Ensembles through the facade: steps as requests into their composing models, tensors passed by
name, the ensemble's statistics and its composing models', and Triton's refusals of broken ones
(the messages match Triton 2.51's: ``tests/differential/test_ensemble_vs_triton.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from reference_server.core.errors import Code, ServerError
from reference_server.core.types import InferRequest
from tests.core.conftest import Collector, ServerFactory, identity_config, write_model

STEP = 'model_name: "{model}" model_version: -1 input_map {{ key: "INPUT0" value: "{src}" }} output_map {{ key: "OUTPUT0" value: "{dst}" }}'


def ensemble_config(
    name: str,
    steps: list[tuple[str, str, str]],
    inputs: tuple[str, ...] = ("IN",),
    outputs: tuple[str, ...] = ("OUT",),
    max_batch_size: int = 8,
    dims: str = "4",
) -> str:
    """An ensemble of identity steps ``(model, source tensor, destination tensor)``."""
    tensors = "".join(
        f'input {{ name: "{n}" data_type: TYPE_FP32 dims: [ {dims} ] }}\n' for n in inputs
    ) + "".join(
        f'output {{ name: "{n}" data_type: TYPE_FP32 dims: [ {dims} ] }}\n' for n in outputs
    )
    body = ",\n".join("{ " + STEP.format(model=m, src=s, dst=d) + " }" for m, s, d in steps)
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n{tensors}'
        f"ensemble_scheduling {{ step [\n{body}\n] }}\n"
    )


PIPE = [("pre", "IN", "mid"), ("post", "mid", "OUT")]


def _repo(root: Path) -> None:
    write_model(root, "pre", identity_config("pre", "dynamic_batching { }"))
    write_model(root, "post", identity_config("post", "dynamic_batching { }"))
    write_model(root, "pipe", ensemble_config("pipe", PIPE))


def ensemble_request(value: float, rid: str = "", batch: int = 1, **kw: object) -> InferRequest:
    return InferRequest(
        model_name="pipe",
        id=rid,
        inputs={"IN": np.full((batch, 4), value, dtype=np.float32)},
        input_datatypes={"IN": "FP32"},
        **kw,  # type: ignore[arg-type]
    )


def test_steps_run_in_their_composing_models_and_each_keeps_its_statistics(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    _repo(tmp_path)
    # Explicit control loading only the ensemble: its composing models are loaded with it.
    server = make_server(models=("pipe",), model_control_mode="explicit")
    assert [m["state"] for m in server.repository_index()] == ["READY"] * 3
    for i in range(3):
        answer = server.infer_sync(ensemble_request(float(i), rid=f"r{i}", batch=2), 10)
        assert answer.model_name == "pipe" and answer.id == f"r{i}"
        assert list(answer.outputs) == ["OUT"] and answer.output_datatypes == {"OUT": "FP32"}
        np.testing.assert_array_equal(answer.outputs["OUT"], np.full((2, 4), i, np.float32))
    (pipe,) = server.model_statistics("pipe")["model_stats"]
    stats = pipe["inference_stats"]
    # The ensemble's own view: a request per execution, a queue that ends as its steps start,
    # its steps' compute; its duration holds its steps' queues and computes.
    assert pipe["inference_count"] == 6 and pipe["execution_count"] == 3
    assert stats["success"]["count"] == 3 and stats["queue"]["count"] == 3
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in pipe["batch_stats"]] == [(2, 3)]
    assert stats["success"]["ns"] >= stats["queue"]["ns"] + stats["compute_infer"]["ns"]
    assert stats["compute_infer"]["ns"] > 0
    for model in ("pre", "post"):
        (step,) = server.model_statistics(model)["model_stats"]
        assert step["inference_count"] == 6 and step["execution_count"] == 3
    assert server.model_metadata("pipe")["platform"] == "ensemble"
    assert server.device_info("pipe") == []


def test_steps_batch_in_their_composing_models(tmp_path: Path, make_server: ServerFactory) -> None:
    write_model(
        tmp_path,
        "pre",
        identity_config(
            "pre",
            "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }",
        ),
    )
    write_model(tmp_path, "post", identity_config("post"))
    write_model(tmp_path, "pipe", ensemble_config("pipe", PIPE))
    server = make_server()
    got = Collector()
    for i in range(4):
        server.submit(ensemble_request(float(i), rid=str(i)), got.callback(str(i)))
    got.wait(4)
    assert all(not isinstance(r, ServerError) for r in got.results.values())
    # pre holds its batch until four wait (or 5 s pass): the four requests' steps formed one
    # batch there whatever the thread timing; post has no batcher: one execution each.
    (pre,) = server.model_statistics("pre")["model_stats"]
    (post,) = server.model_statistics("post")["model_stats"]
    assert pre["execution_count"] == 1 and post["execution_count"] == 4


def test_a_failing_step_fails_the_request_with_the_ensemble_named(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    _repo(tmp_path)
    server = make_server()
    server.unload_model("post")
    with pytest.raises(ServerError) as failed:
        server.infer_sync(ensemble_request(1.0, rid="x"), 10)
    assert failed.value.message.startswith("in ensemble 'pipe', ")
    assert "post" in failed.value.message
    (pipe,) = server.model_statistics("pipe")["model_stats"]
    assert pipe["inference_stats"]["fail"]["count"] == 1 and pipe["execution_count"] == 0
    with pytest.raises(ServerError, match=r"batch-size must be <= 8 for 'pipe'") as big:
        server.infer_sync(ensemble_request(1.0, batch=9), 10)
    assert big.value.code == Code.INVALID_ARG


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            ensemble_config("bad", [("pre", "x", "y"), ("post", "y", "x"), ("pre", "IN", "OUT")]),
            "failed to poll from model repository: ensemble tensor 'y' is unused in ensemble 'bad'",
        ),
        (
            ensemble_config("bad", [("pre", "IN", "OUT"), ("post", "IN", "OUT")]),
            "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'bad' step 1",
        ),
        (
            ensemble_config("bad", [("pre", "IN", "OUT")], inputs=("IN", "EXTRA")),
            "ensemble input 'EXTRA' for ensemble bad' is not used",
        ),
        (
            ensemble_config("bad", [("pre", "IN", "mid")]),
            "ensemble output 'OUT' for ensemble bad' is not used",
        ),
        (
            ensemble_config("bad", [("pre", "IN", "mid"), ("post", "lost", "OUT")]),
            "output 'OUT' for ensemble 'bad' is not written: at least one of its depending "
            "tensors, 'lost', is not connected",
        ),
        (
            ensemble_config("bad", [("nosuch", "IN", "OUT")]),
            "load failed for model 'bad': ensemble bad contains models that are not available "
            "or ambiguous: nosuch",
        ),
        (
            ensemble_config("bad", [("pre", "IN", "OUT")], dims="3"),
            "in ensemble bad, ensemble tensor IN: inconsistent shape: [-1,3] is inferred from "
            "model bad while [-1,4] is inferred from model pre",
        ),
        (
            ensemble_config("bad", [("pre", "IN", "OUT")], max_batch_size=16),
            "ensemble bad allows maximum batch size 16, but it contains model pre which only "
            "allows maximum batch size to be 8",
        ),
    ],
    ids=[
        "cycle",
        "written-twice",
        "unused-input",
        "unused-output",
        "not-connected",
        "missing-model",
        "shape",
        "batch-size",
    ],
)
def test_broken_ensembles_are_refused_as_triton_refuses_them(
    tmp_path: Path, make_server: ServerFactory, config: str, message: str
) -> None:
    _repo(tmp_path)
    write_model(tmp_path, "bad", config)
    server = make_server(models=("pre", "post"), model_control_mode="explicit")
    with pytest.raises(ServerError) as refused:
        server.load_model("bad")
    assert message in refused.value.message
    assert {m["name"] for m in server.repository_index(ready_only=True)} == {"pre", "post"}
