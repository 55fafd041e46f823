"""Views of the requests an :class:`~analyzer.load.inputs.InputSet` makes (pure numpy).

:func:`binary_request`: one request's binary-tensor body and its JSON header's length;
:func:`request_sizes`: how large each request is along the inputs that vary (a sequence
length, a string length), the request sizes a probe times and a mix weighs
(:class:`RequestSizes`).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.utils import serialize_byte_tensor

from analyzer.errors import InputError
from analyzer.load.inputs import InputSet, Payload, _inner_dims


def binary_request(inputs: InputSet, index: int) -> tuple[bytes, int]:
    """Payload ``index`` of ``inputs`` as a KServe v2 ``infer`` body with the binary tensor
    extension, and the length of its JSON header (``Inference-Header-Content-Length``).

    Each tensor goes with the payload's own shape (a data file or a ``distribution`` mixes
    shapes); BYTES elements are serialised as Triton reads them (a 4-byte little-endian length,
    then the bytes), numeric tensors as their little-endian bytes. Outputs come back binary.
    """
    payload = inputs.payloads[index]
    header_inputs = []
    blobs = []
    for spec in inputs.specs:
        array = payload[spec.name]
        if spec.datatype == "BYTES":
            serialized = serialize_byte_tensor(np.asarray(array, dtype=np.object_))
            blob = serialized.item() if serialized.size else b""
        else:
            data = np.ascontiguousarray(array)
            if data.dtype.byteorder == ">":
                data = data.byteswap().view(data.dtype.newbyteorder("<"))
            blob = data.tobytes()
        header_inputs.append(
            {
                "name": spec.name,
                "shape": [int(d) for d in array.shape],
                "datatype": spec.datatype,
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    header = json.dumps(
        {"inputs": header_inputs, "parameters": {"binary_data_output": True}},
        separators=(",", ":"),
    ).encode()
    return header + b"".join(blobs), len(header)


@dataclass(frozen=True)
class RequestSizes:
    """How large each payload of a rotation is, as a batch padded to its longest member sees it.

    Attributes:
        measure: What a size counts, in words (for a profile's provenance).
        sizes: Per payload (aligned with ``InputSet.payloads``): the elements per batch item of
            its largest variable-dim input, else the bytes of its longest BYTES element, else 0
            (every request alike).
        keys: Per payload: requests with different keys never share a batch (Triton batches
            inputs with a variable dim and no ``allow_ragged_batch`` only at equal shapes);
            None where any payload may join any batch.
        items: Batch items per request (the load's batch size; 1 for a model that does not
            batch).
    """

    measure: str
    sizes: tuple[int, ...]
    keys: tuple[Hashable, ...]
    items: int


def request_sizes(
    inputs: InputSet, metadata: Mapping[str, Any], config: Mapping[str, Any]
) -> RequestSizes:
    """The size and batching key of every payload of ``inputs`` (see :class:`RequestSizes`).

    Args:
        inputs: The rotation, as :func:`build_inputs` built it.
        metadata: The model's metadata document (which inputs have a variable dim).
        config: The model's config document, JSON (which inputs allow ragged batches).

    Raises:
        InputError: The payloads' variable inputs do not grow together (one payload has an
            input longer and another shorter than a second payload's): no single size says
            which member a batch pads to.
    """
    batching = inputs.max_batch_size > 0
    ragged = {
        str(entry.get("name")): bool(entry.get("allow_ragged_batch"))
        for entry in config.get("input", [])
    }
    variable = [
        entry["name"]
        for entry in metadata.get("inputs", [])
        if -1 in _inner_dims(entry, inputs.max_batch_size)
    ]
    strings = [s.name for s in inputs.specs if s.datatype == "BYTES"]
    keyed = [name for name in variable if not ragged.get(name, False)]

    def item_shape(array: np.ndarray) -> tuple[int, ...]:
        return tuple(int(d) for d in (array.shape[1:] if batching else array.shape))

    def components(payload: Payload) -> tuple[int, ...]:
        if variable:
            return tuple(math.prod(item_shape(payload[name])) for name in variable)
        return tuple(
            max((len(_as_bytes(e)) for e in payload[name].ravel()), default=0) for name in strings
        )

    vectors = [components(p) for p in inputs.payloads]
    _check_ordered(vectors, variable or strings)
    if variable:
        measure = (
            f"elements per batch item of {_names(variable)}"
            if len(variable) > 1
            else f"elements per batch item of {variable[0]!r}"
        )
    elif strings:
        measure = f"bytes of the longest element of {_names(strings)}"
    else:
        measure = "none: every request has the same shapes"
    keys: tuple[Hashable, ...] = tuple(
        tuple((name, item_shape(p[name])) for name in keyed) if keyed else None
        for p in inputs.payloads
    )
    return RequestSizes(
        measure=measure,
        sizes=tuple(max(v, default=0) for v in vectors),
        keys=keys,
        items=inputs.batch_size if batching else 1,
    )


def _as_bytes(element: Any) -> bytes:
    return element if isinstance(element, bytes) else str(element).encode()


def _names(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _check_ordered(vectors: Sequence[tuple[int, ...]], names: Sequence[str]) -> None:
    """Refuse component vectors that are not totally ordered (each <= the next, by parts)."""
    distinct = sorted(set(vectors), key=lambda v: (sum(v), v))
    for a, b in itertools.pairwise(distinct):
        if any(x > y for x, y in zip(a, b, strict=True)):
            grows = [n for n, x, y in zip(names, a, b, strict=True) if x < y]
            shrinks = [n for n, x, y in zip(names, a, b, strict=True) if x > y]
            raise InputError(
                f"the request data's inputs do not grow together: one request has "
                f"{_names(grows)} longer and {_names(shrinks)} shorter than another "
                f"({dict(zip(names, a, strict=True))} vs {dict(zip(names, b, strict=True))}), so "
                "no one size says what a batch of them pads to"
            )
