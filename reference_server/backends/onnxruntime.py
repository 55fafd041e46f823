"""The ONNX Runtime backend: the only module that imports ``onnxruntime``.

A batch's inputs are concatenated along the batch dimension, run in one ``session.run`` and the
outputs split back by each request's batch size. The execution provider is CUDA when the config
``device`` parameter (or the server's default) is ``cuda``, or ``auto`` on a KIND_GPU
instance, and onnxruntime offers ``CUDAExecutionProvider``; otherwise CPU. The provider the
session actually uses is reported by :meth:`OnnxRuntimeBackend.device_info`, so reports can say
which device ran.

Config parameters: ``device`` (cpu|cuda|auto), ``intra_op_threads``, ``inter_op_threads``
(0 = ONNX Runtime's default).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from reference_server.backends.base import BackendArgs, mark_compute, response_for
from reference_server.core.config import protocol_datatype
from reference_server.core.errors import BackendError, ServerError
from reference_server.core.repository import inside
from reference_server.core.types import InferRequest, InferResponse

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def choose_providers(
    device: str, instance_kind: str, device_id: int, available: Sequence[str]
) -> list[Any]:
    """The provider list for a session (pure, for tests).

    Args:
        device: ``cpu``, ``cuda`` or ``auto``.
        instance_kind: The instance group kind (KIND_CPU forces CPU).
        device_id: GPU of a KIND_GPU instance.
        available: ``onnxruntime.get_available_providers()``.
    """
    # "auto" follows the instance placement; "cuda" asks for the GPU even on a CPU instance.
    want_cuda = device == "cuda" or (device == "auto" and instance_kind == "KIND_GPU")
    if want_cuda and CUDA in available:
        return [(CUDA, {"device_id": str(device_id)}), CPU]
    return [CPU]


class OnnxRuntimeBackend:
    """Runs ``<version>/model.onnx`` (or ``default_model_filename``) with ONNX Runtime."""

    def __init__(self) -> None:
        self._args: BackendArgs | None = None
        self._session: ort.InferenceSession | None = None
        self._requested = "auto"
        self._output_names: list[str] = []

    def initialize(self, args: BackendArgs) -> None:
        cfg = args.config
        filename = cfg.default_model_filename or "model.onnx"
        # Messages name the file relative to the model directory, never the server's paths.
        shown = f"{args.version_dir.name}/{filename}"
        path = inside(args.version_dir, filename, "model file", resolve_links=False)
        if not path.is_file():
            raise BackendError(
                f"unable to find '{shown}' for model '{args.model_name}': put the ONNX file in "
                "the version directory"
            )
        options = ort.SessionOptions()
        intra = int(args.parameters.get("intra_op_threads", "0") or 0)
        inter = int(args.parameters.get("inter_op_threads", "0") or 0)
        if intra > 0:
            options.intra_op_num_threads = intra
        if inter > 0:
            options.inter_op_num_threads = inter
        self._requested = args.parameters.get("device", "auto") or "auto"
        providers = choose_providers(
            self._requested, args.instance_kind, args.device_id, ort.get_available_providers()
        )
        try:
            self._session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            detail = str(exc).replace(str(path), shown)
            raise BackendError(f"failed to load ONNX model '{shown}': {detail}") from exc
        session_outputs = [o.name for o in self._session.get_outputs()]
        self._output_names = [o.name for o in cfg.output] or session_outputs
        unknown = [n for n in self._output_names if n not in session_outputs]
        if unknown:
            raise BackendError(
                f"model '{args.model_name}' config lists outputs {unknown} that the ONNX "
                f"graph does not have (it has {session_outputs})"
            )
        self._args = args

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | ServerError]:
        assert self._args is not None and self._session is not None
        if self._args.config.max_batch_size <= 0:
            results: list[InferResponse | ServerError] = []
            for req in requests:
                outs = self._session.run(self._output_names, dict(req.inputs))
                results.append(self._response(req, outs))
            return results
        names = list(requests[0].inputs)
        feed = {
            n: np.concatenate([r.inputs[n] for r in requests], axis=0)
            if len(requests) > 1
            else requests[0].inputs[n]
            for n in names
        }
        input_end = time.monotonic_ns()
        outs = self._session.run(self._output_names, feed)
        output_start = time.monotonic_ns()
        mark_compute(requests, input_end, output_start)
        sizes = [max(1, r.batch_size) for r in requests]
        splits = np.cumsum(sizes)[:-1]
        per_output = [np.split(np.asarray(o), splits, axis=0) for o in outs]
        return [
            self._response(req, [parts[i] for parts in per_output])
            for i, req in enumerate(requests)
        ]

    def _response(self, req: InferRequest, outs: Sequence[Any]) -> InferResponse:
        assert self._args is not None
        resp = response_for(req, self._args)
        types = {o.name: protocol_datatype(o.data_type) for o in self._args.config.output}
        for name, value in zip(self._output_names, outs, strict=True):
            array = np.asarray(value)
            resp.outputs[name] = array
            resp.output_datatypes[name] = types.get(name, "FP32")
        return resp

    def finalize(self) -> None:
        self._session = None
        self._args = None

    def device_info(self) -> dict[str, str]:
        provider = self._session.get_providers()[0] if self._session is not None else ""
        return {
            "backend": "onnxruntime",
            "requested_device": self._requested,
            "provider": provider,
            "device": "cuda" if provider == CUDA else "cpu",
            "onnxruntime_version": ort.__version__,
        }
