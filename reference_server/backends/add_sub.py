"""The add_sub backend: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (Triton's example)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reference_server.backends.base import BackendArgs, response_for
from reference_server.core.config import protocol_datatype
from reference_server.core.errors import BackendError, ServerError
from reference_server.core.types import InferRequest, InferResponse


class AddSubBackend:
    """Element-wise sum and difference of two inputs."""

    def __init__(self) -> None:
        self._args: BackendArgs | None = None

    def initialize(self, args: BackendArgs) -> None:
        cfg = args.config
        if len(cfg.input) != 2 or len(cfg.output) != 2:
            raise BackendError(
                f"add_sub model '{args.model_name}' needs exactly 2 inputs and 2 outputs"
            )
        self._args = args

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | ServerError]:
        assert self._args is not None
        cfg = self._args.config
        in0, in1 = cfg.input[0].name, cfg.input[1].name
        out0, out1 = cfg.output[0], cfg.output[1]
        responses: list[InferResponse | ServerError] = []
        for req in requests:
            a, b = req.inputs[in0], req.inputs[in1]
            resp = response_for(req, self._args)
            resp.outputs[out0.name] = np.add(a, b).astype(a.dtype, copy=False)
            resp.outputs[out1.name] = np.subtract(a, b).astype(a.dtype, copy=False)
            resp.output_datatypes[out0.name] = protocol_datatype(out0.data_type)
            resp.output_datatypes[out1.name] = protocol_datatype(out1.data_type)
            responses.append(resp)
        return responses

    def finalize(self) -> None:
        self._args = None

    def device_info(self) -> dict[str, str]:
        return {"backend": "add_sub", "device": "cpu"}
