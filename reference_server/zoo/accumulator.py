"""A stateful model on the simulated device: the running sum of each sequence's inputs.

``accumulator`` keeps one sum per correlation id (the CORRID control), reset by START, and
answers every request with the sum so far: a request routed to the wrong sequence, a lost
START or a reordered stream shows in the outputs. Each execution costs the simulated device's
time from its latency profile (``accumulator_sim``, like the simulated resnet50's), so the
sequence batcher's knobs have a measurable price.

Outputs (by config name; each optional except ``OUTPUT``):

* ``OUTPUT``: the running sum after this request (the input's dtype);
* ``BATCH_SIZE``: how many requests the execution held (null requests of the direct strategy
  included), INT32;
* ``EXECUTION``: the instance's execution counter (from 1), INT64: requests with the same value
  ran together.

The model reads only its control tensors (START, END, READY, CORRID), as a Triton model does;
null requests (READY false) leave every sum untouched. :func:`accumulator_config` builds the
config; :func:`make_repository` writes a repository that serves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends.base import BackendArgs
from reference_server.backends.simulated import SimulatedBackend
from reference_server.batching.sequence import BoolControl, Controls
from reference_server.core.config import config_to_text
from reference_server.core.errors import BackendError, ServerError
from reference_server.core.types import InferRequest, InferResponse

MODEL_NAME = "accumulator"
PROFILE = "accumulator_sim"


class AccumulatorBackend(SimulatedBackend):
    """Running sums per correlation id, timed by a simulated device."""

    def __init__(self) -> None:
        super().__init__()
        self._sums: dict[object, np.ndarray] = {}
        self._controls = Controls()
        self._executions = 0

    def initialize(self, args: BackendArgs) -> None:
        if not args.parameters.get("profile"):
            args.parameters["profile"] = PROFILE
        super().initialize(args)
        cfg = args.config
        if not cfg.HasField("sequence_batching"):
            raise BackendError(f"accumulator model '{args.model_name}' needs sequence_batching")
        self._controls = Controls.from_config(cfg)
        if self._controls.corrid is None:
            raise BackendError(
                f"accumulator model '{args.model_name}' needs a CONTROL_SEQUENCE_CORRID input "
                "(its state is kept per correlation id)"
            )
        if not cfg.input or not any(o.name == "OUTPUT" for o in cfg.output):
            raise BackendError(f"accumulator model '{args.model_name}' needs an OUTPUT output")

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | ServerError]:
        responses = super().execute(requests)  # the device time, and zero outputs
        assert self._args is not None
        cfg = self._args.config
        self._executions += 1
        in_name = cfg.input[0].name
        wanted = {o.name for o in cfg.output}
        for req, resp in zip(requests, responses, strict=True):
            if isinstance(resp, ServerError):
                continue
            value = req.inputs[in_name]
            if self._is_ready(req):
                key = self._correlation(req)
                if self._flag(req, self._controls.start) or key not in self._sums:
                    self._sums[key] = np.zeros_like(value)
                self._sums[key] = self._sums[key] + value
                ended = self._flag(req, self._controls.end)
                total = self._sums.pop(key) if ended else self._sums[key]
            else:
                total = np.zeros_like(value)
            resp.outputs["OUTPUT"] = total.astype(value.dtype, copy=False)
            if "BATCH_SIZE" in wanted:
                resp.outputs["BATCH_SIZE"] = np.full_like(
                    resp.outputs["BATCH_SIZE"], len(requests), dtype=np.int32
                )
            if "EXECUTION" in wanted:
                resp.outputs["EXECUTION"] = np.full_like(
                    resp.outputs["EXECUTION"], self._executions, dtype=np.int64
                )
        return responses

    def _is_ready(self, req: InferRequest) -> bool:
        return self._controls.ready is None or self._flag(req, self._controls.ready)

    def _flag(self, req: InferRequest, control: BoolControl | None) -> bool:
        if control is None or control.name not in req.inputs:
            return False
        return bool(req.inputs[control.name].reshape(-1)[0] == control.true_value)

    def _correlation(self, req: InferRequest) -> object:
        assert self._controls.corrid is not None
        value = req.inputs[self._controls.corrid[0]].reshape(-1)[0]
        return value if isinstance(value, bytes) else int(value)

    def finalize(self) -> None:
        self._sums.clear()
        super().finalize()

    def device_info(self) -> dict[str, str]:
        return {**super().device_info(), "backend": "accumulator"}


def accumulator_config(
    name: str = MODEL_NAME,
    *,
    max_batch_size: int = 8,
    oldest: bool = True,
    max_candidate_sequences: int = 0,
    max_queue_delay_us: int = 0,
    preferred: Sequence[int] = (),
    max_idle_us: int = 0,
    backend: str = "accumulator",
    data_type: int = mc.TYPE_INT32,
    control_type: str = "int32",
) -> mc.ModelConfig:
    """The accumulator's config: INPUT [1] -> OUTPUT [1], BATCH_SIZE, EXECUTION.

    Args:
        name: Model name.
        max_batch_size: Also the slot count of the direct strategy.
        oldest: The oldest strategy (False: direct).
        max_candidate_sequences: ``oldest.max_candidate_sequences`` (0 = max_batch_size).
        max_queue_delay_us: The strategy's queue delay.
        preferred: ``oldest.preferred_batch_size``.
        max_idle_us: ``max_sequence_idle_microseconds`` (0 = Triton's default, 1 s).
        backend: ``"accumulator"`` here; a test gives Triton ``"python"`` with its own model.
        data_type: Type of INPUT and OUTPUT.
        control_type: START/READY values as ``"int32"``, ``"fp32"`` or ``"bool"``.
    """
    cfg = mc.ModelConfig(name=name, backend=backend, max_batch_size=max_batch_size)
    cfg.input.append(mc.ModelInput(name="INPUT", data_type=data_type, dims=[1]))
    cfg.output.append(mc.ModelOutput(name="OUTPUT", data_type=data_type, dims=[1]))
    cfg.output.append(mc.ModelOutput(name="BATCH_SIZE", data_type=mc.TYPE_INT32, dims=[1]))
    cfg.output.append(mc.ModelOutput(name="EXECUTION", data_type=mc.TYPE_INT64, dims=[1]))
    sb = cfg.sequence_batching
    if max_idle_us:
        sb.max_sequence_idle_microseconds = max_idle_us
    if oldest:
        sb.oldest.max_candidate_sequences = max_candidate_sequences
        sb.oldest.max_queue_delay_microseconds = max_queue_delay_us
        sb.oldest.preferred_batch_size.extend(preferred)
    else:
        sb.direct.max_queue_delay_microseconds = max_queue_delay_us
    kinds = mc.ModelSequenceBatching.Control
    for tensor, kind in (
        ("START", kinds.CONTROL_SEQUENCE_START),
        ("END", kinds.CONTROL_SEQUENCE_END),
        ("READY", kinds.CONTROL_SEQUENCE_READY),
    ):
        control = sb.control_input.add(name=tensor).control.add(kind=kind)
        if control_type == "int32":
            control.int32_false_true.extend([0, 1])
        elif control_type == "fp32":
            control.fp32_false_true.extend([0.0, 1.0])
        else:
            control.bool_false_true.extend([False, True])
    sb.control_input.add(name="CORRID").control.add(
        kind=kinds.CONTROL_SEQUENCE_CORRID, data_type=mc.TYPE_UINT64
    )
    cfg.instance_group.append(mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU, count=1))
    return cfg


def make_repository(root: Path, config: mc.ModelConfig | None = None) -> Path:
    """Write ``root/<name>/config.pbtxt`` (and version 1) for the accumulator; return ``root``."""
    cfg = config if config is not None else accumulator_config()
    model_dir = Path(root) / cfg.name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config_to_text(cfg), encoding="utf-8")
    return Path(root)
