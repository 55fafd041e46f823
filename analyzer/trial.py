"""One trial's knobs and the config they make.

Nothing here imports optuna or gevent, so the dashboard and the report can use the knobs
cheaply. ``analyzer.search`` encodes :class:`Knobs` for the sampler; ``analyzer.sweep``
measures trials with :class:`analyzer.evaluation.Evaluator` and records each as an
:class:`analyzer.records.TrialRecord` (the one trial record type; its typed measurement answers
what the trial's numbers rest on).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc


@dataclass(frozen=True)
class Knobs:
    """The searched part of a model config.

    Attributes:
        max_batch_size: Largest batch the scheduler forms (``max_batch_size``).
        max_queue_delay_us: How long a request may wait for a batch to fill, microseconds.
        preferred_batch_size: Batch sizes the scheduler dispatches as soon as it can form them.
        instance_count: Model instances (``instance_group[0].count``).
        dynamic_batching: False only for a baseline config without a dynamic batcher.
    """

    max_batch_size: int
    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    instance_count: int = 1
    dynamic_batching: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The ``config`` object of every result file (see docs/internals.md)."""
        out: dict[str, Any] = {
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_us": self.max_queue_delay_us,
            "preferred_batch_size": list(self.preferred_batch_size),
            "instance_count": self.instance_count,
        }
        if not self.dynamic_batching:
            out["dynamic_batching"] = False
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Knobs:
        """Inverse of :meth:`to_dict`."""
        return cls(
            max_batch_size=int(data["max_batch_size"]),
            max_queue_delay_us=int(data["max_queue_delay_us"]),
            preferred_batch_size=tuple(int(s) for s in data["preferred_batch_size"]),
            instance_count=int(data["instance_count"]),
            dynamic_batching=bool(data.get("dynamic_batching", True)),
        )

    def label(self) -> str:
        """Short human label: ``mbs=16 delay=500us pref=[16,8] x2``."""
        if not self.dynamic_batching:
            return f"mbs={self.max_batch_size} no dynamic batching x{self.instance_count}"
        pref = ",".join(str(s) for s in self.preferred_batch_size) or "-"
        return (
            f"mbs={self.max_batch_size} delay={self.max_queue_delay_us}us "
            f"pref=[{pref}] x{self.instance_count}"
        )


# --------------------------------------------------------------------------------------------------
# Configs


def knobs_of(config: mc.ModelConfig) -> Knobs:
    """The knobs a ModelConfig sets (the baseline's knobs).

    A preferred list of exactly ``[max_batch_size]`` reads as none: it is how Triton normalises
    ``dynamic_batching {}``, and it batches the same way.
    """
    batching = config.HasField("dynamic_batching")
    batcher = config.dynamic_batching
    preferred = tuple(batcher.preferred_batch_size) if batching else ()
    if preferred == (config.max_batch_size,):
        preferred = ()
    return Knobs(
        max_batch_size=max(config.max_batch_size, 1),
        max_queue_delay_us=int(batcher.max_queue_delay_microseconds) if batching else 0,
        preferred_batch_size=preferred,
        instance_count=sum(g.count or 1 for g in config.instance_group) or 1,
        dynamic_batching=batching,
    )


def apply_knobs(base: mc.ModelConfig, knobs: Knobs) -> mc.ModelConfig:
    """``base`` with the knobs set; everything else (inputs, backend, parameters) kept.

    The instance count goes on the first instance group (one is created, of the base kind, when
    the base has none); other groups are dropped because the count is a total.
    """
    config = mc.ModelConfig()
    config.CopyFrom(base)
    config.max_batch_size = knobs.max_batch_size
    if knobs.dynamic_batching:
        config.dynamic_batching.max_queue_delay_microseconds = knobs.max_queue_delay_us
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(knobs.preferred_batch_size)
    else:
        config.ClearField("dynamic_batching")
    first = mc.ModelInstanceGroup()
    if base.instance_group:
        first.CopyFrom(base.instance_group[0])
    else:
        first.kind = mc.ModelInstanceGroup.KIND_AUTO
    first.count = knobs.instance_count
    del config.instance_group[:]
    config.instance_group.append(first)
    return config
