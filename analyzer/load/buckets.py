"""Client-side padding to length buckets: what lets a variable-length model batch without ragged
batches.

Triton's dynamic batcher puts requests in one batch only when their variable-dim inputs have the
same shape (unless the input sets ``allow_ragged_batch``). A client that pads every request's
variable dims up to the nearest of a few lengths (its bucket) sends a handful of shapes instead
of one per length, so neighbours in the queue match far more often, at the cost of the padding
each request carries. :func:`pad_to_buckets` pads a rotation's payloads as such a client would:
each variable dim of each input up to the payload's bucket (the smallest bucket at or above its
longest variable dim), filled with the pad value the user declared per input (0 for token ids
and attention masks). ``auto`` picks the buckets from the data's own lengths
(:func:`auto_buckets`).

The sweep then measures the traffic that client sends, and the simulator predicts it: the probe
sizes the padded payloads (a few lengths, a batching key per bucket).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from analyzer.errors import InputError

__all__ = ["AUTO_QUANTILES", "BUCKET_MULTIPLE", "auto_buckets", "pad_to_buckets"]

#: ``auto``: one bucket at each of these quantiles of the data's lengths.
AUTO_QUANTILES = (0.25, 0.5, 0.75, 1.0)

#: Buckets are rounded up to a multiple of this many elements (what kernels like).
BUCKET_MULTIPLE = 8

#: The rotation's payloads: one array per input name.
Payload = dict[str, np.ndarray]


def auto_buckets(lengths: Sequence[int]) -> tuple[int, ...]:
    """Buckets for requests of these ``lengths``: the lengths at :data:`AUTO_QUANTILES` of the
    requests, each rounded up to a multiple of :data:`BUCKET_MULTIPLE` (the longest request
    always fits)."""
    if not lengths:
        raise InputError("pad_buckets = 'auto' needs request data with variable-length inputs")
    ordered = sorted(lengths)
    picked = set()
    for q in AUTO_QUANTILES:
        length = ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]
        picked.add(BUCKET_MULTIPLE * math.ceil(max(1, length) / BUCKET_MULTIPLE))
    return tuple(sorted(picked))


def _length(payload: Payload, variable: Mapping[str, Sequence[int]]) -> int:
    """The longest variable dim of any variable input of ``payload``."""
    return max(
        (int(payload[name].shape[axis]) for name, axes in variable.items() for axis in axes),
        default=0,
    )


def pad_to_buckets(
    payloads: Sequence[Payload],
    variable: Mapping[str, Sequence[int]],
    buckets: Sequence[int] | str,
    pad_values: Mapping[str, float],
) -> tuple[list[Payload], tuple[int, ...]]:
    """``payloads`` with every variable dim padded up to its payload's bucket.

    Args:
        payloads: The rotation (each input's array with its batch axis, if any).
        variable: Input name -> the axes of its array that vary (batch axis excluded).
        buckets: Lengths, ascending or not, or ``"auto"`` (:func:`auto_buckets`).
        pad_values: Input name -> the value padding fills with; one per variable input.

    Returns:
        The padded payloads and the buckets used, ascending.

    Raises:
        InputError: no input has a variable dim, an input has no pad value, or a request is
            longer than the largest bucket.
    """
    if not variable:
        raise InputError(
            "pad_buckets: the model has no input with a variable dimension (-1), so every "
            "request already has one shape; remove pad_buckets"
        )
    missing = [name for name in variable if name not in pad_values]
    if missing:
        raise InputError(
            f"pad_buckets needs a pad value for every variable input: add "
            f"{', '.join(f'{n}=<value>' for n in missing)} to pad_values (e.g. 0 for token ids "
            "and attention masks)"
        )
    lengths = [_length(p, variable) for p in payloads]
    chosen = auto_buckets(lengths) if buckets == "auto" else tuple(sorted(int(b) for b in buckets))
    if not chosen or chosen[0] < 1:
        raise InputError(f"pad_buckets: lengths must be >= 1, got {list(chosen)}")
    padded = []
    for index, (payload, length) in enumerate(zip(payloads, lengths, strict=True)):
        bucket = next((b for b in chosen if b >= length), None)
        if bucket is None:
            raise InputError(
                f"request {index} of the data is {length} long, above the largest bucket "
                f"{chosen[-1]}: add a bucket of {length} or more (or use pad_buckets = 'auto')"
            )
        out = dict(payload)
        for name, axes in variable.items():
            array = payload[name]
            widths = [(0, 0)] * array.ndim
            for axis in axes:
                widths[axis] = (0, bucket - int(array.shape[axis]))
            out[name] = np.pad(array, widths, constant_values=array.dtype.type(pad_values[name]))
        padded.append(out)
    return padded, chosen
