"""The backend protocol: what a backend is given (:class:`BackendArgs`) and what it implements.

A backend object serves one model instance. ``execute`` receives a batch as a list of whole
requests and returns one response per request, in the same order; an entry may be a
:class:`~reference_server.core.errors.ServerError` to fail just that request. An exception fails
every request of the batch (failure reason ``BACKEND``). A decoupled model's backend (the
generative one) answers later instead, through each request's ``response_sender``.

This is the lowest layer of the backends: it imports no backend and nothing from the batching
layer that runs them (the instance's device is the :class:`Device` protocol, which
``reference_server.batching.instances.Device`` satisfies).
:mod:`reference_server.backends.registry` chooses a backend for a model config.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.errors import ServerError
from reference_server.core.gpu import DeviceMeter
from reference_server.core.types import InferRequest, InferResponse


class Device(Protocol):
    """The device an instance runs on, shared by every instance placed on it (one per simulated
    or real GPU; ``reference_server.batching.instances.Device`` is one).

    Attributes:
        name: ``"cpu"``, ``"gpu0"``, ``"sim-gpu0"``...
        meter: Busy time (the device's timeline: ``DeviceMeter.book``) and memory of simulated
            instances.
    """

    @property
    def name(self) -> str: ...

    @property
    def meter(self) -> DeviceMeter: ...


@dataclass
class BackendArgs:
    """What a backend learns about its model and instance at ``initialize``.

    Attributes:
        model_name: Model name.
        model_version: Version string (``"1"``).
        config: The normalized model config.
        version_dir: ``<repository>/<model>/<version>`` (may not exist for file-less backends).
        instance_name: E.g. ``resnet50_0_1``.
        instance_kind: ``KIND_CPU`` / ``KIND_GPU`` / ``KIND_MODEL``.
        device_id: GPU id for KIND_GPU instances, else 0.
        device: The shared device object the instance runs on (one per simulated/real GPU).
        instance_index: Position of the instance among the model's instances (seeds RNGs).
    """

    model_name: str
    model_version: str
    config: mc.ModelConfig
    version_dir: Path
    instance_name: str
    instance_kind: str
    device_id: int
    device: Device
    instance_index: int = 0
    parameters: dict[str, str] = field(default_factory=dict)


class Backend(Protocol):
    """One model instance's executor (Python-backend style)."""

    def initialize(self, args: BackendArgs) -> None:
        """Prepare to execute (load weights, create sessions); raise BackendError to refuse."""

    def execute(
        self, requests: Sequence[InferRequest]
    ) -> Sequence[InferResponse | ServerError | None]:
        """Run a batch; one response (or error) per request, same order.

        A decoupled model's backend returns None for a request it answers through the
        request's ``response_sender`` instead (any number of responses, the last ``final``).
        """
        ...

    def finalize(self) -> None:
        """Release resources; called once after the last execute."""

    def device_info(self) -> dict[str, str]:
        """What actually runs the model (e.g. ``{"provider": "CPUExecutionProvider"}``)."""
        ...


def mark_compute(requests: Sequence[InferRequest], input_end_ns: int, output_start_ns: int) -> None:
    """Record where a batch's compute_input phase ended and compute_output began.

    The core measures the batch's start and end itself; a backend that knows its phases calls
    this so statistics split the time into compute_input / compute_infer / compute_output.
    """
    for req in requests:
        req.compute_input_end_ns = input_end_ns
        req.compute_output_start_ns = output_start_ns


def now_ns() -> int:
    """The monotonic clock the core uses for timestamps."""
    return time.monotonic_ns()


def response_for(request: InferRequest, args: BackendArgs) -> InferResponse:
    """An empty response addressed to ``request``."""
    return InferResponse(
        model_name=args.model_name, model_version=args.model_version, id=request.id
    )


def batch_size_of(request: InferRequest, config: mc.ModelConfig) -> int:
    """The request's batch size (first dim of its first input; 1 for non-batching models)."""
    if config.max_batch_size <= 0 or not request.inputs:
        return 1
    first = next(iter(request.inputs.values()))
    return int(first.shape[0]) if first.ndim else 1
