"""What the profile phase measures and the configs it loads (pure: no server).

:class:`ProbePlan` (sizes, bursts, instances, budget), :func:`geometric_sizes` (1, 2, 4, ...
and ``max_batch_size``), :func:`probe_config` (``max_batch_size: b``, ``preferred_batch_size:
[b]`` and :data:`PROBE_DELAY_US`, so a burst of ``b`` requests becomes one execution of ``b``)
and :func:`model_metadata` (a config's tensors as the server's metadata names them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

#: Queue delay of every probe config: long enough that only the preferred size ends a batch,
#: short enough that a burst cut short by a lost request costs one second, not a hang.
PROBE_DELAY_US = 1_000_000


@dataclass(frozen=True)
class ProbePlan:
    """What the profile phase measures.

    Attributes:
        batch_sizes: Sizes to execute (each <= the model's ``max_batch_size``); None = 1, 2,
            4, ... up to ``max_batch_size`` (which is always included).
        bursts: Measured bursts per size (one execution each at one instance); the size of the
            interference probe gets :data:`REFERENCE_BURSTS` times as many, the interference
            probe itself :data:`INTERFERENCE_BURSTS` times.
        warmup_bursts: Bursts per loaded config before measuring (first executions are slow
            on real backends).
        instances: Instance count of the interference probe (1 or less: none).
        interference_batch: Batch size of the interference probe; None = the median size.
        max_requests: Most inferences the whole phase sends.
        time_budget_s: The phase stops starting bursts after this many seconds.
        request_timeout_s: One inference's timeout.
        size_classes: Request sizes timed at each batch size where the data's requests
            differ in size (at least 2: the smallest and the largest; the others at evenly
            spaced quantiles of the data's sizes).
    """

    batch_sizes: tuple[int, ...] | None = None
    bursts: int = 6
    warmup_bursts: int = 1
    instances: int = 2
    interference_batch: int | None = None
    max_requests: int = 2000
    time_budget_s: float = 60.0
    request_timeout_s: float = 30.0
    size_classes: int = 4


def geometric_sizes(max_batch_size: int, items: int = 1) -> tuple[int, ...]:
    """1, 2, 4, ... below ``max_batch_size``, and ``max_batch_size`` itself; with requests of
    ``items`` batch items, those multiples of ``items`` (up to the largest that fits)."""
    requests = max(1, max_batch_size // max(1, items))
    sizes = {requests}
    b = 1
    while b < requests:
        sizes.add(b)
        b *= 2
    return tuple(sorted(s * max(1, items) for s in sizes))


def probe_config(base: mc.ModelConfig, batch_size: int, instances: int) -> mc.ModelConfig:
    """``base`` with dynamic batching that forms batches of exactly ``batch_size``."""
    config = mc.ModelConfig()
    config.CopyFrom(base)
    config.max_batch_size = batch_size
    config.dynamic_batching.Clear()
    config.dynamic_batching.max_queue_delay_microseconds = PROBE_DELAY_US
    config.dynamic_batching.preferred_batch_size.append(batch_size)
    if not config.instance_group:
        config.instance_group.add()
    del config.instance_group[1:]
    # On one device: a KIND_GPU group lists its GPUs, and Triton runs its count on each.
    del config.instance_group[0].gpus[1:]
    config.instance_group[0].count = instances
    return config


def model_metadata(config: mc.ModelConfig) -> dict[str, Any]:
    """The model's metadata document (``GET /v2/models/<m>``) as its config implies it: what
    :func:`~analyzer.load.inputs.build_inputs` reads (names, datatypes, shapes with the batch
    dim as ``-1``)."""

    def tensors(entries: Iterable[Any]) -> list[dict[str, Any]]:
        out = []
        for tensor in entries:
            datatype = mc.DataType.Name(tensor.data_type).removeprefix("TYPE_")
            dims = [int(d) for d in tensor.dims]
            out.append(
                {
                    "name": tensor.name,
                    "datatype": {"STRING": "BYTES"}.get(datatype, datatype),
                    "shape": [-1, *dims] if config.max_batch_size > 0 else dims,
                }
            )
        return out

    return {"name": config.name, "inputs": tensors(config.input), "outputs": tensors(config.output)}


__all__ = ["PROBE_DELAY_US", "ProbePlan", "geometric_sizes", "model_metadata", "probe_config"]
