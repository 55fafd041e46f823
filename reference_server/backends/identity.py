"""The identity backend: output i is a copy of input i (like Triton's identity backend).

Config parameter ``execute_delay_ms`` makes each execution sleep that long (Triton's qa uses the
same knob for timing tests); ``execute_delay_ms_per_item`` adds a delay per batch item. A
request parameter ``execute_delay_ms`` lengthens the execution of the batch that carries it
(tests use it to make one particular batch slow).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from reference_server.backends.base import BackendArgs, response_for
from reference_server.core.config import protocol_datatype
from reference_server.core.errors import ServerError
from reference_server.core.types import InferRequest, InferResponse


class IdentityBackend:
    """Copies every input to the output at the same position."""

    def __init__(self) -> None:
        self._args: BackendArgs | None = None
        self._delay_s = 0.0
        self._per_item_s = 0.0
        self._pairs: list[tuple[str, str, str]] = []

    def initialize(self, args: BackendArgs) -> None:
        self._args = args
        self._delay_s = float(args.parameters.get("execute_delay_ms", "0") or 0) / 1000.0
        self._per_item_s = float(args.parameters.get("execute_delay_ms_per_item", "0") or 0) / 1000
        cfg = args.config
        self._pairs = [
            (inp.name, out.name, protocol_datatype(out.data_type))
            for inp, out in zip(cfg.input, cfg.output, strict=False)
        ]

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | ServerError]:
        assert self._args is not None
        delay = self._delay_s + self._per_item_s * sum(max(1, r.batch_size) for r in requests)
        delay += max(_param_ms(r) for r in requests) / 1000.0
        if delay > 0:
            time.sleep(delay)
        responses: list[InferResponse | ServerError] = []
        for req in requests:
            resp = response_for(req, self._args)
            for in_name, out_name, datatype in self._pairs:
                if in_name in req.inputs:
                    resp.outputs[out_name] = req.inputs[in_name].copy()
                    resp.output_datatypes[out_name] = datatype
            responses.append(resp)
        return responses

    def finalize(self) -> None:
        self._args = None

    def device_info(self) -> dict[str, str]:
        return {"backend": "identity", "device": "cpu"}


def _param_ms(request: InferRequest) -> float:
    value = request.parameters.get("execute_delay_ms", 0)
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return 0.0
