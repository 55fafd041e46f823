"""Ensembles on the reference server against the real Triton 2.51, same models, same requests.

The composing models are Triton Python-backend sleep models (identity, 5 ms an execution) and
the reference server's identity backend with the same config. Both servers must give the same
config and metadata for the ensemble, the same outputs, the same statistics counts for the
ensemble and for each composing model (a request per ensemble execution; each step a request
into its model's own batcher: four ensemble requests sent together form one batch of four in a
composing model whose preferred size is four), and the same refusals of broken ensembles. Where
Triton refuses a config while polling the repository it answers only "failed to poll" and logs
why; the reference server appends the reason (a documented addition), so there Triton's text
must begin the reference server's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc

from tests.support.differential import settled_stats
from tests.support.real_triton import (
    RealTriton,
    TensorSpec,
    TritonInstall,
    dynamic_batching,
    sleep_model_config,
)
from tests.support.servers import ReferenceServer, write_model

pytestmark = pytest.mark.triton

Server = RealTriton | ReferenceServer


def _ensemble(
    name: str,
    steps: list[tuple[str, str, str]],
    inputs: tuple[tuple[str, int], ...] = (("IN", 4),),
    outputs: tuple[tuple[str, int], ...] = (("OUT", 4),),
    max_batch_size: int = 8,
) -> mc.ModelConfig:
    """An ensemble of identity steps ``(model, source tensor, destination tensor)``."""
    config = mc.ModelConfig(name=name, platform="ensemble", max_batch_size=max_batch_size)
    for tensor, dim in inputs:
        config.input.add(name=tensor, data_type=mc.TYPE_FP32, dims=[dim])
    for tensor, dim in outputs:
        config.output.add(name=tensor, data_type=mc.TYPE_FP32, dims=[dim])
    for model, source, destination in steps:
        step = config.ensemble_scheduling.step.add(model_name=model, model_version=-1)
        step.input_map["INPUT0"] = source
        step.output_map["OUTPUT0"] = destination
    return config


def _stage(name: str, **batching: Any) -> mc.ModelConfig:
    return sleep_model_config(
        name,
        max_batch_size=8,
        inputs=(TensorSpec(dims=(4,)),),
        dynamic_batching=dynamic_batching(**batching),
        execute_delay_ms=5,
    )


PIPE = _ensemble("pipe", [("pre", "IN", "mid"), ("post", "mid", "OUT")])
# pre holds its batch until four requests wait (or 5 s pass): four ensemble requests sent
# together become one execution of four there, whatever the threads' timing.
MODELS = [
    _stage("pre", preferred=(4,), max_queue_delay_us=5_000_000),
    _stage("post", max_queue_delay_us=0),
    PIPE,
]
BROKEN = {
    "missing_model": _ensemble("b1", [("nosuch", "IN", "OUT")]),
    "cycle": _ensemble("b2", [("pre", "x", "y"), ("post", "y", "x"), ("pre", "IN", "OUT")]),
    "written_twice": _ensemble("b3", [("pre", "IN", "OUT"), ("post", "IN", "OUT")]),
    "shape": _ensemble("b5", [("pre", "IN", "OUT")], inputs=(("IN", 3),), outputs=(("OUT", 3),)),
    "unused_input": _ensemble("b6", [("pre", "IN", "OUT")], inputs=(("IN", 4), ("EXTRA", 4))),
    "batch_size": _ensemble("b7", [("pre", "IN", "OUT")], max_batch_size=16),
    "not_written": _ensemble("b8", [("pre", "IN", "mid")]),
}
BAD_INPUT = _ensemble("b4", [("pre", "IN", "OUT")])
BAD_INPUT.ensemble_scheduling.step[0].input_map.clear()
BAD_INPUT.ensemble_scheduling.step[0].input_map["NOPE"] = "IN"
BROKEN["unknown_input"] = BAD_INPUT


def _infer(client: httpclient.InferenceServerClient, value: float, batch: int) -> np.ndarray:
    tensor = httpclient.InferInput("IN", [batch, 4], "FP32")
    tensor.set_data_from_numpy(np.full((batch, 4), value, np.float32))
    return client.infer("pipe", [tensor]).as_numpy("OUT")


def _counts(server: Server, model: str, successes: int, items: int) -> dict[str, Any]:
    stats = settled_stats(server, model, successes=successes, items=items)
    return {
        "inference_count": stats["inference_count"],
        "execution_count": stats["execution_count"],
        **{k: v["count"] for k, v in stats["inference_stats"].items()},
        "batch_stats": sorted(
            (b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]
        ),
    }


def _observe(server: Server) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(server.http_url)
    seen: dict[str, Any] = {
        "config": client.get_model_config("pipe"),
        "metadata": client.get_model_metadata("pipe"),
        "index": client.get_model_repository_index(),
    }
    # Four at once, each on a client of its own (a client is not shared across threads):
    # one batch of four in pre, then post's own batches (no delay: those depend on timing).
    answers: dict[int, np.ndarray] = {}

    def send(i: int) -> None:
        answers[i] = _infer(httpclient.InferenceServerClient(server.http_url), i, 1)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    seen["outputs"] = {i: answers[i].tolist() for i in sorted(answers)}
    seen["outputs_batch_2"] = _infer(client, 7.0, 2).tolist()
    try:
        _infer(client, 0.0, 9)
        seen["too_big"] = "answered"
    except Exception as exc:
        seen["too_big"] = str(exc)
    seen["pipe"] = _counts(server, "pipe", successes=5, items=6)
    seen["pre"] = _counts(server, "pre", successes=5, items=6)
    post = settled_stats(server, "post", successes=5, items=6)
    seen["post"] = (post["inference_count"], post["inference_stats"]["success"]["count"])
    for case, config in BROKEN.items():
        write_model(server.repository, config.name, config)
        try:
            server.load_model(config.name)
            seen[case] = "loaded"
        except RuntimeError as exc:
            seen[case] = str(exc)
    return seen


@pytest.fixture(scope="module")
def observed(
    triton_install: TritonInstall, serves: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, dict[str, Any]]]:
    with RealTriton(triton_install, tmp_path_factory.mktemp("triton"), models=MODELS) as triton:
        on_triton = _observe(triton)
    reference = ReferenceServer(tmp_path_factory.mktemp("reference"), models=MODELS)
    reference.start()
    try:
        yield {"triton": on_triton, "reference": _observe(reference)}
    finally:
        reference.stop()


def test_the_ensemble_serves_and_reports_as_on_triton(observed: dict[str, dict[str, Any]]) -> None:
    triton, reference = observed["triton"], observed["reference"]
    for key in ("config", "metadata", "index", "outputs", "outputs_batch_2", "too_big", "post"):
        assert reference[key] == triton[key], key
    assert triton["outputs"] == {i: [[float(i)] * 4] for i in range(4)}
    # The ensemble: a request per execution; its batch sizes are its requests' sizes.
    assert reference["pipe"] == triton["pipe"]
    assert triton["pipe"]["execution_count"] == 5 and triton["pipe"]["batch_stats"] == [
        (1, 4),
        (2, 1),
    ]
    # Its steps went through pre's batcher: the four together, then the batch of two.
    assert reference["pre"] == triton["pre"]
    assert triton["pre"]["batch_stats"] == [(2, 1), (4, 1)]


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_ensemble_is_refused_as_on_triton(
    observed: dict[str, dict[str, Any]], case: str
) -> None:
    triton, reference = observed["triton"][case], observed["reference"][case]
    assert triton != "loaded"
    if "failed to poll from model repository" in triton:
        stem = triton.rstrip('"}\n').rstrip()
        assert reference.startswith(stem) and len(reference) > len(triton), (reference, triton)
    else:
        assert reference == triton
