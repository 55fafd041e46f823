"""A model's signature as its config declares it: whether a request fits (Triton's core
validation, §5.4, in Triton's order and with its messages) and its KServe metadata; shared by
every kind of loaded model (one network or an ensemble)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.config import numpy_dtype, protocol_datatype
from reference_server.core.errors import Code, ServerError
from reference_server.core.types import InferRequest

_SHAPE_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
    "to be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def shape_str(shape: Any) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


class RequestCheck:
    """The checks of one model's config, prepared once."""

    def __init__(self, config: mc.ModelConfig) -> None:
        self.config = config
        self.name = config.name
        self._inputs = {i.name: i for i in config.input}
        self._outputs = {o.name: o for o in config.output}
        self._required = [i.name for i in config.input if not i.optional]
        self._has_optional = any(i.optional for i in config.input)

    def check(self, req: InferRequest) -> tuple[int, Hashable]:
        """Check a request against the config (§5.4 core validation, Triton's order).

        Returns:
            ``bs(r)`` and the batch-compatibility key.

        Raises:
            ServerError: INVALID_ARG with the ``[request id: ...]`` prefix.
        """
        prefix = f"[request id: {req.id or '<id_unknown>'}] "
        name = self.name

        def fail(message: str) -> ServerError:
            return ServerError(prefix + message, Code.INVALID_ARG)

        seen: set[str] = set()
        for out in req.requested_outputs:
            if out.name not in self._outputs:
                raise fail(f"unexpected inference output '{out.name}' for model '{name}'")
            if out.name in seen:
                raise fail(f"output '{out.name}' already exists in request")
            seen.add(out.name)
        # As Triton 2.51 does it (checked against the binary): the names of a request whose
        # input count is out of range are listed in reverse order and an empty "missing" list
        # prints as "]"; with the count in range only unknown names are refused (no prefix),
        # so a missing required input is not detected when an optional one stands in for it.
        given = list(req.inputs)
        n_all, n_req = len(self._inputs), len(self._required)
        if not n_req <= len(given) <= n_all:
            missing = [n for n in self._required if n not in req.inputs]
            got = "[" + ",".join(f"'{n}'" for n in reversed(given)) + "]"
            miss = "[" + ",".join(f"'{n}'" for n in missing) + "]" if missing else "]"
            expected = (
                f"expected {n_all} inputs"
                if n_req == n_all
                else f"expected number of inputs between {n_req} and {n_all}"
            )
            raise fail(
                f"{expected} but got {len(given)} inputs for model '{name}'. Got input(s) "
                f"{got}, but missing required input(s) {miss}. Please provide all required "
                "input(s)."
            )
        for in_name in given:
            if in_name not in self._inputs:
                raise ServerError(
                    f"unexpected inference input '{in_name}' for model '{name}'", Code.INVALID_ARG
                )
        batching = self.config.max_batch_size > 0
        batch_size = 0
        for in_name, array in req.inputs.items():
            spec = self._inputs[in_name]
            if batching and not spec.is_shape_tensor:
                if array.ndim == 0:
                    raise fail(
                        f"input '{in_name}' has no shape but model requires batch dimension "
                        f"for '{name}'"
                    )
                if batch_size == 0:
                    batch_size = int(array.shape[0])
                elif int(array.shape[0]) != batch_size:
                    raise fail(
                        f"input '{in_name}' batch size does not match other inputs for '{name}'"
                    )
        if batching and batch_size > self.config.max_batch_size:
            raise fail(
                f"inference request batch-size must be <= {self.config.max_batch_size} for '{name}'"
            )
        key: list[Hashable] = []
        for in_name, array in req.inputs.items():
            spec = self._inputs[in_name]
            expected_dt = protocol_datatype(spec.data_type)
            got_dt = req.input_datatypes.get(in_name) or datatype_of(array)
            if got_dt != expected_dt:
                raise fail(
                    f"inference input '{in_name}' data-type is '{got_dt}', but model "
                    f"'{name}' expects '{expected_dt}'"
                )
            dims = [int(d) for d in spec.dims]
            shape = [int(d) for d in array.shape]
            item_shape = shape[1:] if batching and not spec.is_shape_tensor else shape
            if len(item_shape) != len(dims) or any(
                d != -1 and d != s for d, s in zip(dims, item_shape, strict=False)
            ):
                full = ([-1] if batching and not spec.is_shape_tensor else []) + dims
                note = " " + _SHAPE_NOTE if batching else ""
                raise fail(
                    f"unexpected shape for input '{in_name}' for model '{name}'. Expected "
                    f"{shape_str(full)}, got {shape_str(shape)}.{note}"
                )
            if spec.is_shape_tensor:
                key.append((in_name, tuple(shape), np.ascontiguousarray(array).tobytes()))
            elif -1 in dims and not spec.allow_ragged_batch:
                key.append((in_name, tuple(item_shape)))
        if self._has_optional:
            key.append(frozenset(req.inputs))
        return max(1, batch_size), tuple(key)


def metadata_of(config: mc.ModelConfig, version: str) -> dict[str, Any]:
    """KServe v2 model metadata of one version (§5.3)."""
    batching = config.max_batch_size > 0

    def tensors(items: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": t.name,
                "datatype": protocol_datatype(t.data_type),
                "shape": ([-1] if batching else []) + [int(d) for d in t.dims],
            }
            for t in items
        ]

    return {
        "name": config.name,
        "versions": [version],
        "platform": config.platform or config.backend,
        "inputs": tensors(config.input),
        "outputs": tensors(config.output),
    }


def datatype_of(array: np.ndarray) -> str:
    """The KServe datatype of a numpy array."""
    for datatype in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32"):
        if array.dtype == numpy_dtype(datatype):
            return datatype
    for datatype in ("INT64", "FP16", "FP32", "FP64"):
        if array.dtype == numpy_dtype(datatype):
            return datatype
    if array.dtype == np.object_ or array.dtype.kind in "SU":
        return "BYTES"
    return str(array.dtype).upper()
