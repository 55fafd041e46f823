"""What the simulator takes and gives: :class:`SimConfig` (the config knobs it honours, and
:func:`check_modelled`, which refuses the ones it does not), :class:`Prediction` (one
simulated rate) and :class:`CapacityPrediction` (the highest rate that meets a goal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analyzer.errors import InputError
from reference_server.batching.decide import BatchingParams

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as mc

    from analyzer.config.knobs import Knobs

__all__ = ["CapacityPrediction", "Prediction", "SimConfig", "check_modelled"]


@dataclass(frozen=True)
class SimConfig:
    """The config knobs the simulator honours.

    Attributes:
        max_batch_size: ``max_batch_size`` of the model (>= 1).
        max_queue_delay_us: ``dynamic_batching.max_queue_delay_microseconds``.
        preferred_batch_size: Preferred sizes; empty = Triton's normalisation ``[max_batch_size]``.
        instance_count: Instances on the one device.
        dynamic_batching: False = the default scheduler (every request its own batch).
        queue_policy: The config sets priority levels or a queue policy, which the simulator
            does not model (:func:`check_modelled` refuses it).
    """

    max_batch_size: int
    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    instance_count: int = 1
    dynamic_batching: bool = True
    queue_policy: bool = False
    #: Requests of different shapes may share a batch (``allow_ragged_batch``): the mix's
    #: batching keys are ignored, and a batch is timed at its longest member. False: as the
    #: profile's mix says (profiled with the model's own config).
    ragged_batch: bool = False

    @property
    def largest_batch(self) -> int:
        """The largest execution this config can produce (of one-item requests)."""
        return max(1, self.max_batch_size) if self.dynamic_batching else 1

    def largest_items(self, items: int = 1) -> int:
        """The largest execution with requests of ``items`` batch items each: without dynamic
        batching, one request."""
        return max(1, self.max_batch_size) if self.dynamic_batching else max(1, items)

    def params(self) -> BatchingParams:
        """The batcher's parameters after Triton's normalisation."""
        mbs = max(1, self.max_batch_size)
        preferred = frozenset(self.preferred_batch_size) or frozenset({mbs})
        return BatchingParams(mbs, preferred, self.max_queue_delay_us * 1000)

    @classmethod
    def from_knobs(cls, knobs: Knobs) -> SimConfig:
        """From a run's config (a record's :class:`analyzer.config.knobs.Knobs`)."""
        return cls(
            max_batch_size=knobs.max_batch_size,
            max_queue_delay_us=knobs.max_queue_delay_us,
            preferred_batch_size=tuple(knobs.preferred_batch_size),
            instance_count=knobs.instance_count,
            dynamic_batching=knobs.dynamic_batching,
            queue_policy=knobs.queue_policy is not None and not knobs.queue_policy.fifo,
            ragged_batch=bool(knobs.ragged_batch),
        )

    @classmethod
    def from_model_config(cls, config: mc.ModelConfig) -> SimConfig:
        """From a server's model config (``GET /v2/models/<m>/config``, parsed)."""
        from analyzer.config.model_config import instances_of

        dynamic = config.HasField("dynamic_batching")
        batching = config.dynamic_batching
        return cls(
            max_batch_size=max(1, config.max_batch_size),
            max_queue_delay_us=int(batching.max_queue_delay_microseconds) if dynamic else 0,
            preferred_batch_size=tuple(batching.preferred_batch_size) if dynamic else (),
            # Triton's counting: a KIND_GPU group runs its count on each listed GPU.
            instance_count=sum(instances_of(g) for g in config.instance_group) or 1,
            dynamic_batching=dynamic and config.max_batch_size > 0,
            ragged_batch=any(i.allow_ragged_batch for i in config.input if -1 in i.dims),
            # A default policy equal to Triton's own serialises to nothing.
            queue_policy=dynamic
            and bool(
                batching.priority_levels
                or batching.priority_queue_policy
                or batching.default_queue_policy.ByteSize()
            ),
        )

    def describe(self) -> str:
        """One line, as the console prints it."""
        if not self.dynamic_batching:
            return f"no dynamic batching, {self.instance_count} instance(s)"
        pref = ",".join(map(str, self.preferred_batch_size)) or f"{self.max_batch_size} (default)"
        return (
            f"max_batch_size {self.max_batch_size}, max_queue_delay_us {self.max_queue_delay_us}, "
            f"preferred {pref}, {self.instance_count} instance(s)"
            + (", priority levels or a queue policy" if self.queue_policy else "")
        )


def check_modelled(config: SimConfig) -> None:
    """Refuse a config the simulator would predict wrongly.

    Raises:
        InputError: the config sets priority levels or a queue policy.
    """
    if config.queue_policy:
        raise InputError(
            f"cannot predict {config.describe()}: the simulator models one FIFO queue without "
            "timeouts, not priority levels or queue policies; measure this config instead"
        )


@dataclass(frozen=True)
class Prediction:
    """What the simulator predicts at one rate.

    Attributes:
        rate_rps: Offered rate (of the simulated arrival process).
        requests: Requests measured (after the warm-up ones).
        p50_ms / p99_ms / mean_ms: Latency of the measured requests (arrival to completion).
        throughput_rps: Measured requests / the span from the first measured arrival to the
            last completion.
        batch_sizes: Executions per batch size over the whole simulation.
        saturated: Throughput below 90 % of the rate: the rate is above what the config serves.
        stopped_early: The run stopped once the p99 goal could no longer be met.
        stage_batch_sizes: A pipeline's: each stage's executions per batch size (its
            ``batch_sizes`` is then empty).
        latencies_ms: Each measured request's latency, in the order they arrived; kept only
            when asked (``keep_latencies``: a virtual-time load reads its windows from them),
            never written.
    """

    rate_rps: float
    requests: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    throughput_rps: float
    batch_sizes: dict[int, int]
    saturated: bool = False
    stopped_early: bool = False
    stage_batch_sizes: dict[str, dict[int, int]] = field(default_factory=dict)
    latencies_ms: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (batch sizes keyed by strings)."""
        stages = {
            name: {str(k): v for k, v in sorted(sizes.items())}
            for name, sizes in self.stage_batch_sizes.items()
        }
        return ({"stage_batch_sizes": stages} if stages else {}) | {
            "rate_rps": self.rate_rps,
            "requests": self.requests,
            "p50_ms": _json_float(self.p50_ms),
            "p99_ms": _json_float(self.p99_ms),
            "mean_ms": _json_float(self.mean_ms),
            "throughput_rps": self.throughput_rps,
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "saturated": self.saturated,
            "stopped_early": self.stopped_early,
        }


@dataclass(frozen=True)
class CapacityPrediction:
    """The highest rate whose simulated p99 meets the goal.

    Attributes:
        p99_ms: The goal.
        capacity_rps: Highest passing rate found (0 when even ``min_rps`` fails).
        at_capacity: The prediction at that rate (None when nothing passed).
        upper_rps: Lowest failing rate found (the bracket's top).
        steps: Every simulated rate in order, with its p99 (inf when it stopped early).
    """

    p99_ms: float
    capacity_rps: float
    at_capacity: Prediction | None
    upper_rps: float
    steps: tuple[tuple[float, float], ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "p99_ms": self.p99_ms,
            "capacity_rps": self.capacity_rps,
            "upper_rps": self.upper_rps,
            "at_capacity": self.at_capacity.to_dict() if self.at_capacity else None,
            "steps": [[r, _json_float(p)] for r, p in self.steps],
        }


def _json_float(x: float) -> float | None:
    return x if math.isfinite(x) else None
