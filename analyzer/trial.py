"""One trial: the knobs, the config they make, how a config is measured, and the result record.

Nothing here imports optuna or gevent, so the dashboard and the report can use the knobs and
the records cheaply. ``analyzer.search`` encodes :class:`Knobs` for the sampler;
``analyzer.sweep`` runs trials with :class:`Evaluator` and stores :class:`TrialResult` records.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from analyzer.measure import (
    LOW_SAMPLE_P99,
    Arrival,
    CapacityResult,
    CapacitySearch,
    CapacitySpec,
    GainSample,
    Goals,
    GpuStats,
    LoadGenerator,
    LoadMode,
    LoadSpec,
    Measurement,
    WindowStats,
    goals_met,
    meets_goals,
    p99_sample_note,
    unusable,
)
from analyzer.scenario import Scenario


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


def gain_sample(result: TrialResult, objective: str) -> GainSample:
    """One measurement of one side of the gain, with the range its truth lies in.

    Capacity (``throughput``/``pareto``): the capacity found (0 when the goals were missed), up to
    the lowest failing rate above it that the search measured (a search only brackets the
    capacity). ``latency``: the p99 (infinite when the goals were missed), down to the best
    window's p99 and up to the worst's.
    """
    raw = result.measurement or {}
    if objective == "latency":
        if not result.meets_goals:
            return GainSample(math.inf, math.inf, math.inf)
        windows = [WindowStats.from_dict(w) for w in raw.get("windows", ())]
        p99s = [w.p99_ms for w in windows if w.request_count > 0] + [result.p99_ms]
        return GainSample(result.p99_ms, min(p99s), max(p99s))
    value = result.throughput_rps if result.meets_goals else 0.0
    capacity = raw.get("capacity") if "capacity" in raw else raw
    high = value
    closed_loop = isinstance(capacity, Mapping) and any(
        p.get("mode") == "concurrency" for p in capacity.get("points", ())
    )
    if value > 0 and isinstance(capacity, Mapping) and not closed_loop:
        # Closed loop: the levels are user counts, not rates, so they bound nothing here.
        failing = [
            float(p["target"])
            for p in capacity.get("points", ())
            if float(p.get("target", 0)) > value
            and not meets_goals(Measurement.from_dict(p), Goals(**capacity["goals"]))[0]
        ]
        high = min(failing, default=value)
    return GainSample(value, value, high)


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
            points = list(raw.get("points") or ())
            point = min(points, key=lambda p: float(p.get("target", math.inf)), default=None)
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


class Evaluator:
    """Measures the loaded config the way the objective asks for."""

    def __init__(
        self,
        scenario: Scenario,
        load: LoadGenerator,
        on_phase: Callable[[str], None] = lambda text: None,
    ) -> None:
        self.scenario = scenario
        self.load = load
        self.on_phase = on_phase
        self.goals = Goals(
            p99_ms=scenario.goals.p99_ms, max_error_rate=scenario.goals.max_error_rate
        )
        self.reference_rps: float | None = scenario.traffic.rate_rps
        self.hint_rps: float | None = None

    def step(self, factor: float = 1.0) -> LoadSpec:
        """The load-level template (windows ``factor`` times longer when validating)."""
        t, b = self.scenario.traffic, self.scenario.budget
        mode = LoadMode.REQUEST_RATE if t.mode == "rate" else LoadMode.CONCURRENCY
        return LoadSpec(
            mode=mode,
            target=1.0,
            arrival=Arrival(t.arrival),
            warmup_s=b.warmup_s,
            window_s=b.window_s * factor,
            # Count windows: a window ends after min_requests requests (and at least window_s),
            # so a p99 always rests on enough samples, whatever the rate.
            window_requests=round(b.min_requests * factor),
            min_window_s=b.window_s * factor,
            # Two agreeing windows are enough for a search step; validation allows a third.
            stable_windows=2,
            max_windows=2 if factor == 1.0 else 3,
            seed=self.scenario.run.seed,
        )

    def evaluate(
        self, factor: float = 1.0, near_rps: float | None = None
    ) -> tuple[dict[str, float], dict[str, Any], tuple[float, ...]]:
        """Measure; returns (numbers for the record, raw measurement JSON, objective values).

        ``near_rps`` (validation) starts the capacity search just below a known capacity and
        grows in small steps, so a re-measurement costs a few levels, not a full bracket.
        """
        objective = self.scenario.objective
        self._warm_up()
        if objective == "latency":
            m = self._fixed(self._reference_target(), factor)
            numbers = self._numbers(m, m.throughput_rps, m.target)
            return numbers, m.to_dict(), (numbers["p99_ms"],)
        capacity, best, raw = self._capacity(factor, near_rps)
        numbers = self._capacity_numbers(capacity, best, raw)
        if objective == "throughput":
            return numbers, raw, (numbers["throughput_rps"],)
        ref = self._fixed(self._reference_target(), factor)
        raw = {"capacity": raw, "reference": ref.to_dict()}
        numbers["reference_p99_ms"] = ref.p99_ms
        return numbers, raw, (numbers["throughput_rps"], ref.p99_ms)

    def _warm_up(self) -> None:
        """Light load right after a config load, discarded.

        The first requests after a reload pay for new instances, allocations and the
        generator's own start-up; measured, they made the first level of every capacity search
        fail. Each level still has its own ``warmup_s`` on top.
        """
        t, b = self.scenario.traffic, self.scenario.budget
        if b.warmup_s <= 0:
            return
        target = float(t.concurrency or 1) if t.mode == "concurrency" else t.min_rate_rps
        if t.mode == "rate":
            target = min(max(t.start_rps or target, target), t.max_rate_rps)
        self.on_phase("warm-up after the config load")
        spec = replace(
            self.step(),
            target=target,
            warmup_s=0.0,
            window_s=b.warmup_s,
            window_requests=None,
            stable_windows=1,
            max_windows=1,
            fail_fast=None,
        )
        self.load.measure(spec)

    def _reference_target(self) -> float:
        t = self.scenario.traffic
        if t.mode == "concurrency":
            return float(t.concurrency or 1)
        return float(self.reference_rps or t.min_rate_rps)

    def _fixed(self, target: float, factor: float) -> Measurement:
        self.on_phase(
            f"fixed load {target:g} {'req/s' if self.scenario.traffic.mode == 'rate' else 'users'}"
        )
        return self.load.measure(replace(self.step(factor), target=target, fail_fast=None))

    def _capacity(
        self, factor: float, near_rps: float | None = None
    ) -> tuple[float, Measurement | None, dict[str, Any]]:
        t, b = self.scenario.traffic, self.scenario.budget
        if t.mode == "rate":
            start = t.start_rps or min(10 * t.min_rate_rps, t.max_rate_rps)
            growth = 2.0
            if near_rps:
                start, growth = min(max(0.85 * near_rps, t.min_rate_rps), t.max_rate_rps), 1.5
            elif self.hint_rps:
                # Start near half the best capacity seen so far (two steps bracket most configs),
                # but not below the configured start: one unlucky early measurement must not
                # make every later search crawl up from a very low rate.
                start = min(max(self.hint_rps / 2, start), t.max_rate_rps)
            spec = CapacitySpec(
                goals=self.goals,
                start_rps=start,
                max_rps=t.max_rate_rps,
                min_rps=t.min_rate_rps,
                resolution=b.capacity_resolution,
                growth=growth,
                step=self.step(factor),
                # A latency spike of 60-120 ms on a real server can fail one step at a rate the
                # config serves; a failing step counts only when its repeat fails too.
                confirm_failures=True,
            )
            self.on_phase(f"capacity search from {start:.0f} req/s")
            result = self.load.find_capacity(spec)
            return result.capacity_rps, result.best, result.to_dict()
        return self._closed_loop_capacity(factor)

    def _closed_loop_capacity(
        self, factor: float
    ) -> tuple[float, Measurement | None, dict[str, Any]]:
        """Highest concurrency meeting the goals; its throughput is the capacity."""
        t, b = self.scenario.traffic, self.scenario.budget
        spec = CapacitySpec(
            goals=self.goals,
            start_rps=1,
            max_rps=t.max_concurrency,
            min_rps=1,
            resolution=max(b.capacity_resolution, 0.01),
        )
        search = CapacitySearch(spec)
        points: list[Measurement] = []
        tried: dict[int, bool] = {}
        while (level := search.next_rate()) is not None:
            users = max(1, round(level))
            if users in tried:  # integer levels: the bracket cannot narrow further
                break
            self.on_phase(f"concurrency {users}")
            step = replace(self.step(factor), target=float(users), fail_fast=self.goals)
            m = self.load.measure(step)
            points.append(m)
            if not meets_goals(m, self.goals)[0]:  # confirm a failure, as the open loop does
                self.on_phase(f"concurrency {users}: confirming a failing level")
                m = self.load.measure(step)
                points.append(m)
            tried[users] = meets_goals(m, self.goals)[0]
            search.record(level, tried[users])
        passing = [m for m in points if meets_goals(m, self.goals)[0]]
        best = max(passing, key=lambda m: m.throughput_rps, default=None)
        raw = CapacityResult(
            self.goals, best.throughput_rps if best else 0.0, tuple(points), best, search.bracketed
        ).to_dict()
        return (best.throughput_rps if best else 0.0), best, raw

    def _capacity_numbers(
        self, capacity: float, best: Measurement | None, raw: dict[str, Any]
    ) -> dict[str, float]:
        if best is not None:
            return self._numbers(
                best,
                capacity,
                best.target if self.scenario.traffic.mode == "rate" else best.offered_rps,
            )
        # Nothing met the goals: report the gentlest level tried, so the slack says by how much.
        points = [Measurement.from_dict(p) for p in raw.get("points", [])]
        if not points:
            return {
                "throughput_rps": 0.0,
                "offered_rps": 0.0,
                "p50_ms": 0.0,
                "p90_ms": 0.0,
                "p99_ms": math.inf,
                "error_rate": 1.0,
            }
        gentlest = min(points, key=lambda m: m.target)
        numbers = self._numbers(gentlest, 0.0, gentlest.target)
        return numbers

    @staticmethod
    def _numbers(m: Measurement, throughput: float, offered: float) -> dict[str, float]:
        return {
            "throughput_rps": throughput,
            "offered_rps": offered,
            "p50_ms": m.p50_ms,
            "p90_ms": m.p90_ms,
            "p99_ms": m.p99_ms,
            "error_rate": m.error_rate,
            "gpu_memory_peak_mb": peak_gpu_memory_mb(m),
        }

    def constraints(self, numbers: dict[str, float]) -> dict[str, float]:
        """Continuous slacks (<= 0: satisfied), the same keys for every trial."""
        g = self.scenario.goals
        p99 = numbers["p99_ms"] if math.isfinite(numbers["p99_ms"]) else 100 * g.p99_ms
        required = g.min_throughput_rps
        if self.scenario.objective == "latency" and self.scenario.traffic.mode == "rate":
            required = max(required, 0.95 * numbers["offered_rps"])
        if self.scenario.objective != "latency" and numbers["throughput_rps"] <= 0:
            required = max(required, self.scenario.traffic.min_rate_rps)
        throughput_slack = (
            (required - numbers["throughput_rps"]) / required if required > 0 else -1.0
        )
        slacks = {
            "p99_slack": round((p99 - g.p99_ms) / g.p99_ms, 6),
            "err_slack": round(numbers["error_rate"] - g.max_error_rate, 6),
            "throughput_slack": round(throughput_slack, 6),
        }
        if g.max_gpu_memory_mb is not None:
            # A memory goal that cannot be checked (no GPU metric) is not met.
            peak = numbers.get("gpu_memory_peak_mb", math.nan)
            slacks["gpu_memory_slack"] = (
                round((peak - g.max_gpu_memory_mb) / g.max_gpu_memory_mb, 6)
                if math.isfinite(peak)
                else 1.0
            )
        return slacks
