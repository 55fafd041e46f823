"""Decoupled models over the wire: a real Triton (2.51) and the reference engine answer alike.

The real Triton serves a decoupled Python-backend model that sends ``N`` responses (``INT32``
``N`` in, one ``INT32`` out per response); the reference server serves the bundled ``tinyllm``
(one response per token). The protocol shapes must match: the refusals of single-response
endpoints, ``triton_final_response`` on every streamed response, and ``/generate``'s refusal of
a model that answers more than once. A model that is not decoupled answers a stream once,
flagged final, on both.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from reference_server import ServerOptions, ServerThread
from reference_server.core.config import config_to_text
from reference_server.zoo import tinyllm
from tests.server.conftest import raw_request
from tests.support.real_triton import identity_model_config

pytestmark = pytest.mark.triton

DECOUPLED_SOURCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            for i in range(n):
                out = pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == n - 1 else 0
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]), flags=flags)
        return None
"""


@pytest.fixture(scope="module")
def triton_decoupled(real_triton: Any) -> Any:
    """The session's real Triton with the decoupled ``decoupled_n`` model loaded."""
    cfg = mc.ModelConfig(name="decoupled_n", backend="python", max_batch_size=0)
    cfg.model_transaction_policy.decoupled = True
    cfg.input.add(name="N", data_type=mc.TYPE_INT32, dims=[1])
    cfg.output.add(name="OUT", data_type=mc.TYPE_INT32, dims=[1])
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    real_triton.add_model(cfg, DECOUPLED_SOURCE)
    real_triton.load_model("decoupled_n")
    return real_triton


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, serves: None) -> Iterator[ServerThread]:
    """The reference server with ``tinyllm`` and the same ``identity`` model as the Triton's."""
    root = tmp_path_factory.mktemp("decoupled_ref")
    tinyllm.make_repository(root)
    identity = identity_model_config()
    identity.backend = "identity"
    (root / identity.name / "1").mkdir(parents=True)
    (root / identity.name / "config.pbtxt").write_text(config_to_text(identity))
    options = ServerOptions(
        model_repositories=(root,), models=(tinyllm.MODEL_NAME, identity.name), device="sim"
    )
    with ServerThread(options) as running:
        yield running


def _triton_input(n: int) -> list[Any]:
    tensor = grpcclient.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], dtype=np.int32))
    return [tensor]


def _llm_input(n: int) -> list[Any]:
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"a b"], dtype=np.object_))
    params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    sampling = {"max_tokens": n, "ignore_eos": True}
    params.set_data_from_numpy(np.array([json.dumps(sampling).encode()], dtype=np.object_))
    stream = grpcclient.InferInput("stream", [1], "BOOL")
    stream.set_data_from_numpy(np.array([True]))
    return [text, params, stream]


def _identity_input() -> list[Any]:
    tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    return [tensor]


def _flags(url: str, model: str, inputs: list[Any]) -> list[bool]:
    """``triton_final_response`` of each response to one stream request."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    flags: list[bool] = []
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(model, inputs, request_id="r")
        while not flags or not flags[-1]:
            result, error = results.get(timeout=30)
            assert error is None, error
            flags.append(result.get_response().parameters["triton_final_response"].bool_param)
    finally:
        client.stop_stream()
        client.close()
    return flags


def test_every_streamed_response_carries_the_final_flag(
    triton_decoupled: Any, reference: ServerThread
) -> None:
    assert _flags(triton_decoupled.grpc_url, "decoupled_n", _triton_input(3)) == [
        False,
        False,
        True,
    ]
    assert _flags(reference.grpc_url, tinyllm.MODEL_NAME, _llm_input(3)) == [False, False, True]
    assert _flags(triton_decoupled.grpc_url, "identity", _identity_input()) == [True]
    assert _flags(reference.grpc_url, "identity", _identity_input()) == [True]


def _refusals(server: Any, model: str, grpc_inputs: list[Any], http_input: Any) -> list[str]:
    answers = []
    with pytest.raises(InferenceServerException) as grpc_error:
        grpcclient.InferenceServerClient(server.grpc_url).infer(model, grpc_inputs)
    answers.append(f"{grpc_error.value.status()} {grpc_error.value.message()}")
    with pytest.raises(InferenceServerException) as http_error:
        httpclient.InferenceServerClient(server.http_url).infer(model, [http_input])
    answers.append(f"{http_error.value.status()} {http_error.value.message()}")
    return answers


def test_single_response_endpoints_refuse_a_decoupled_model_alike(
    triton_decoupled: Any, reference: ServerThread
) -> None:
    n = httpclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([1], dtype=np.int32))
    text = httpclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"a"], dtype=np.object_))
    triton = _refusals(triton_decoupled, "decoupled_n", _triton_input(1), n)
    ours = _refusals(reference, tinyllm.MODEL_NAME, _llm_input(1), text)
    assert ours == triton
    assert "decoupled transaction policy" in triton[0]


def test_generate_refuses_several_responses_alike(
    triton_decoupled: Any, reference: ServerThread
) -> None:
    triton = raw_request(
        triton_decoupled.http_url, "POST", "/v2/models/decoupled_n/generate", b'{"N": 3}'
    )
    body = {"text_input": "a", "parameters": {"stream": True, "max_tokens": 3}}
    ours = raw_request(
        reference.http_url,
        "POST",
        f"/v2/models/{tinyllm.MODEL_NAME}/generate",
        json.dumps(body).encode(),
    )
    assert (ours[0], json.loads(ours[2])) == (triton[0], json.loads(triton[2]))
