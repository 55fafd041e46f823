"""Request and response records passed between the frontends, the core and the backends.

Tensors are numpy arrays with the full request shape (batch dimension included when the model
batches). BYTES tensors are numpy ``object`` arrays whose elements are ``bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from reference_server.core.shm import RegionSlice

if TYPE_CHECKING:
    from reference_server.core.errors import ServerError

ParamValue = bool | int | float | str


@dataclass
class RequestedOutput:
    """An output the client asked for.

    Attributes:
        name: Output name as in the model config.
        binary_data: HTTP only: return this output in the binary tensor extension.
        class_count: Classification extension: return the top ``class_count`` entries.
        shared_memory: Write the output into this part of a registered shared-memory region
            instead of the response (the response then carries no data for it).
    """

    name: str
    binary_data: bool = False
    class_count: int = 0
    shared_memory: RegionSlice | None = None


@dataclass(eq=False)
class InferRequest:
    """One inference request as the core sees it.

    The frontends fill the first block of fields; the core fills ``batch_size`` and the
    monotonic-ns timestamps as the request moves through the scheduler and an instance.
    A backend may set ``compute_input_end_ns`` and ``compute_output_start_ns`` on the requests
    of a batch to split its execution into input/infer/output phases (see
    :func:`reference_server.backends.base.mark_compute`).
    """

    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    input_datatypes: dict[str, str] = field(default_factory=dict)
    requested_outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    priority: int = 0
    timeout_us: int = 0
    binary_data_output: bool = False
    cancelled: bool = False
    #: Sequence parameters (``sequence_id`` uint64 or string, ``sequence_start``,
    #: ``sequence_end``); 0 / "": the request names no sequence.
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    # Filled by the core.
    batch_size: int = 0
    request_start_ns: int = 0
    queue_start_ns: int = 0
    compute_start_ns: int = 0
    compute_input_end_ns: int = 0
    compute_output_start_ns: int = 0
    compute_end_ns: int = 0
    #: Set by the core while the request is queued: wakes its scheduler on :meth:`cancel`.
    cancel_hook: Callable[[], None] | None = field(default=None, repr=False)
    #: Set by the frontend when it takes every response of a decoupled model (a stream).
    stream_responses: bool = False
    #: Set by the core for a decoupled model: a backend sends each response through it,
    #: ``final`` on the last (Triton's response sender and its COMPLETE_FINAL flag).
    response_sender: Callable[[InferResponse | ServerError, bool], None] | None = field(
        default=None, repr=False
    )

    def cancel(self) -> None:
        """Mark the request cancelled (the client went away).

        A queued request is then dropped and answered CANCELLED at once; setting
        ``cancelled`` directly works too but is only noticed at the batcher's next look.
        """
        self.cancelled = True
        hook = self.cancel_hook
        if hook is not None:
            hook()


@dataclass
class InferResponse:
    """The answer to one request.

    ``outputs`` keeps the order in which the model produced its outputs, which is the order
    both protocols must use on the wire.
    """

    model_name: str
    model_version: str
    id: str
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    output_datatypes: dict[str, str] = field(default_factory=dict)
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    #: False on every response of a decoupled model but its last.
    final: bool = True
