"""One trial: the knobs, the config they make, and the result record.

Nothing here imports optuna or gevent, so the dashboard and the report can use the knobs and
the records cheaply. ``analyzer.search`` encodes :class:`Knobs` for the sampler;
``analyzer.sweep`` measures trials with :class:`analyzer.evaluation.Evaluator` and stores
:class:`TrialResult` records.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.measure import (
    LOW_SAMPLE_P99,
    GpuStats,
    Measurement,
    goals_met,
    p99_sample_note,
    unusable,
)
from analyzer.objective import gentlest


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


# --------------------------------------------------------------------------------------------------
# Records and measurement


@dataclass(frozen=True)
class TrialResult:
    """One measured config (a search trial, the baseline, or a validation repeat)."""

    number: int
    source: str
    knobs: Knobs
    state: str = "complete"
    throughput_rps: float = 0.0
    offered_rps: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    error_rate: float = 0.0
    meets_goals: bool = False
    constraints: dict[str, float] = field(default_factory=dict)
    values: tuple[float, ...] = ()
    failure: str | None = None
    started_at: str = ""
    duration_s: float = 0.0
    measurement: dict[str, Any] | None = None

    def to_record(self) -> dict[str, Any]:
        """The trial record of ``trials/NNN/measurement.json`` (docs/internals.md)."""
        return {
            "number": self.number,
            "source": self.source,
            "state": self.state,
            "config": self.knobs.to_dict(),
            "throughput_rps": self.throughput_rps,
            "offered_rps": self.offered_rps,
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
            "error_rate": self.error_rate,
            "meets_goals": self.meets_goals,
            "constraints": dict(self.constraints),
            "values": list(self.values),
            "failure": self.failure,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "measurement": self.measurement,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TrialResult:
        """Inverse of :meth:`to_record`."""
        names = {f.name for f in dataclasses.fields(cls)} - {"knobs", "values"}
        kwargs = {k: v for k, v in record.items() if k in names}
        # Records written before the one rule could say an invalid measurement met the goals.
        kwargs["meets_goals"] = bool(record.get("meets_goals")) and (
            measurement_problem(record.get("measurement")) is None
        )
        return cls(
            knobs=Knobs.from_dict(record["config"]),
            values=tuple(record.get("values", ())),
            **kwargs,
        )

    def summary_entry(self) -> dict[str, Any]:
        """The ``baseline`` / ``best`` object of summary.json.

        ``p99_n`` is the number of latencies behind the percentiles; a p99 of fewer than
        :data:`~analyzer.measure.LOW_SAMPLE_P99` is ``p99_low_sample`` with a ``p99_note``.
        """
        samples = percentile_samples(self.measurement)
        return {
            "config": self.knobs.to_dict(),
            "throughput_rps": self.throughput_rps,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "p99_n": samples,
            "p99_low_sample": None if samples is None else samples < LOW_SAMPLE_P99,
            "p99_note": p99_sample_note(samples),
            "meets_goals": self.meets_goals,
            "trial_number": self.number,
            "gpus": gpu_figures(self.measurement),
        }


def measurement_problem(raw: Mapping[str, Any] | None) -> str | None:
    """Why a trial's measurement (its ``measurement`` JSON) cannot meet the goals, else None.

    The measurement the trial's numbers rest on must be usable (:func:`analyzer.measure.unusable`):
    the fixed level (``latency``), the reference level (``pareto``) or the capacity search's
    operating point (its ``best`` passed :func:`~analyzer.measure.meets_goals` by construction).
    With :func:`analyzer.measure.goals_met` this is the trial's whole verdict.
    """
    if not raw:
        return None
    if "reference" in raw and "capacity" in raw:
        problem = measurement_problem(raw["reference"])
        return f"reference load: {problem}" if problem else None
    if "points" in raw and "capacity_rps" in raw:
        best = raw.get("best")
        return unusable(Measurement.from_dict(best)) if best else None
    if "mode" in raw:
        return unusable(Measurement.from_dict(raw))
    return None


def trial_meets_goals(raw: Mapping[str, Any] | None, constraints: Mapping[str, float]) -> bool:
    """``TrialResult.meets_goals``: the measurement is usable and every slack is satisfied."""
    return goals_met(measurement_problem(raw), constraints)


def operating_point(raw: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The measurement a trial's numbers rest on: the fixed level, or the capacity search's
    best point (the gentlest point when nothing passed); None when not recorded."""
    if not raw:
        return None
    if "capacity" in raw and isinstance(raw["capacity"], Mapping):
        raw = raw["capacity"]
    if "points" in raw and "capacity_rps" in raw:
        point = raw.get("best")
        if not point:
            point = gentlest(raw.get("points") or ())
        return point or None
    return raw


def gpu_figures(raw: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """Per GPU at the operating point: ``uuid``, ``name``, ``utilization_pct_mean``/``_p95``,
    ``memory_used_peak_mb``, ``memory_total_mb``, ``power_mean_w`` (see ``measure.GpuStats``).

    None when the measurement is not recorded or the server reported no GPU (CPU-only Triton,
    or metrics not readable).
    """
    point = operating_point(raw)
    server = (point or {}).get("server") or {}
    gpus = [GpuStats.from_dict(g) for g in server.get("gpus") or ()]
    if not gpus:
        return None
    keep = (
        "uuid",
        "name",
        "utilization_pct_mean",
        "utilization_pct_p95",
        "memory_used_peak_mb",
        "memory_total_mb",
        "power_mean_w",
        "power_limit_w",
    )
    return [{k: getattr(g, k) for k in keep} for g in gpus]


def server_gpus(*entries: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The GPUs the server reported in summary entries (uuid, name, memory_total_mb), once each."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in entries:
        for g in (entry or {}).get("gpus") or ():
            seen.setdefault(
                g["uuid"],
                {
                    "uuid": g["uuid"],
                    "name": g.get("name"),
                    "memory_total_mb": g.get("memory_total_mb"),
                },
            )
    return list(seen.values())


def peak_gpu_memory_mb(m: Measurement) -> float:
    """The most memory any GPU held during ``m`` (NaN when no GPU figure was recorded)."""
    peaks = [
        g.memory_used_peak_mb
        for g in (m.server.gpus if m.server else ())
        if g.memory_used_peak_mb is not None
    ]
    return max(peaks) if peaks else math.nan


def percentile_samples(raw: Mapping[str, Any] | None) -> int | None:
    """How many latencies the trial's reported percentiles rest on (None: not recorded): the
    request count of its :func:`operating_point`."""
    point = operating_point(raw) or {}
    count = point.get("request_count")
    return int(count) if count is not None else None
