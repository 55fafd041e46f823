"""A three-step pipeline of Triton Python-backend models, written from code (tests and
benchmarks): a cheap preprocess, a GPU-like model whose device work is serialised by a lock every
instance shares, a cheap postprocess, joined by the ensemble ``pipe``; and a BLS model ``bls``
that calls ``pre`` then ``infer`` for each request."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format

from tests.support.real_triton import (
    SLEEP_MODEL_SOURCE,
    TensorSpec,
    dynamic_batching,
    locked_device_source,
    sleep_model_config,
)
from tests.support.servers import write_model

#: The ensemble's steps, in order.
STAGES = ("pre", "infer", "post")

ENSEMBLE = """
name: "pipe"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "a" } },
  { model_name: "infer" model_version: -1
    input_map { key: "INPUT0" value: "a" } output_map { key: "OUTPUT0" value: "b" } },
  { model_name: "post" model_version: -1
    input_map { key: "INPUT0" value: "b" } output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""

#: A BLS model: each request goes through pre, then infer, as two requests of its own.
BLS_SOURCE = '''\
"""BLS model (written by tests/support/pipelines.py): pre, then infer, per request."""

import triton_python_backend_utils as pb_utils


def _call(model, tensor):
    request = pb_utils.InferenceRequest(
        model_name=model,
        requested_output_names=["OUTPUT0"],
        inputs=[pb_utils.Tensor.from_dlpack("INPUT0", tensor)],
    )
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, "OUTPUT0")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out = _call("infer", _call("pre", tensor))
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor.from_dlpack("OUTPUT0", out)]
                )
            )
        return responses
'''


def _stage(name: str, delay_ms: float, max_batch_size: int = 8) -> str:
    config = sleep_model_config(
        name,
        max_batch_size=max_batch_size,
        inputs=(TensorSpec(dims=(16,)),),
        dynamic_batching=dynamic_batching(),
        execute_delay_ms=delay_ms,
    )
    return text_format.MessageToString(config)


def make_pipeline_repository(
    root: Path,
    *,
    host_ms: float = 1.0,
    device_ms: float = 6.0,
    per_item_ms: float = 1.0,
    edge_ms: float = 0.5,
) -> Path:
    """``root/repo`` with pre and post (``edge_ms`` an execution), infer (``host_ms`` that
    overlaps across instances, then ``device_ms + per_item_ms * batch`` under the lock file
    ``root/device.lock``), the ensemble ``pipe`` and the BLS model ``bls``."""
    repo = root / "repo"
    for name in ("pre", "post"):
        write_model(repo, name, _stage(name, edge_ms), model_source=SLEEP_MODEL_SOURCE)
    lock = locked_device_source(root / "device.lock", host_ms, device_ms, per_item_ms)
    write_model(repo, "infer", _stage("infer", 0.0), model_source=lock)
    write_model(repo, "pipe", ENSEMBLE)
    write_model(repo, "bls", _stage("bls", 0.0, max_batch_size=4), model_source=BLS_SOURCE)
    return repo
