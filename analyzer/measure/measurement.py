"""Measurement records: what one load level measured (windows, server view, GPUs, request classes).

The pure logic around them lives beside this module in ``analyzer/measure/``: ``histograms``
(latency summaries), ``specs`` (load levels, goals), ``goals`` (stability, slacks), ``capacity``
(the capacity search), ``gain`` (sample counts, gain interval), ``generator`` (the
``LoadGenerator`` seam, the load output document), ``stepping`` (the sequential step test).

Nothing here touches a socket, a file or gevent: the Locust engine in ``analyzer/load`` fills these
records, and the sweep, the report and the gate read them. Every record round-trips through
``to_dict``/``from_dict``; ``Measurement.to_dict()`` is the per-load-level JSON that
``perfsweep load --output`` writes.

Latencies are integers in microseconds inside HDR histograms (1 µs .. 10 min, 3 significant
figures, i.e. at most 0.1 % relative error); records expose milliseconds (``p99_ms``).

Vocabulary:

* *load level*: one ``LoadSpec`` (closed-loop concurrency N, or open-loop request rate R).
* *window*: one stretch of measurement inside a level (by time or by request count).
* *stable*: the last ``stable_windows`` windows agree within ``stability_pct`` on throughput and p99
  (perf_analyzer's rule); an unstable level is reported and marked, never hidden.
* *sequential step*: a level with ``LoadSpec.sequential`` set stops as soon as the sequential test
  of ``p99 <= goal`` (:mod:`analyzer.measure.stepping`) decides PASS or FAIL, or at its cap
  (BOUNDARY); its :class:`~analyzer.measure.stepping.StepRecord` is ``Measurement.step``. Stability
  is then a check recorded on the measurement, not the stopping rule.
* *valid*: the generator kept up (achieved rate, send lag, CPU); an invalid result says how to fix it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from analyzer.measure.specs import Goals, LoadMode
from analyzer.measure.stepping import StepRecord
from analyzer.measure.tokens import TokenStats


@dataclass(frozen=True)
class GpuStats:
    """One GPU over a window or a level, from the server's ``nv_gpu_*`` series.

    Utilisation is sampled once per window (the gauge at the window's end, which covers the
    server's metrics interval: 2 s on Triton); mean and p95 are over those samples. Power is
    the energy counter's increase over the span when the server publishes it, else the mean
    of the power gauge. A figure the server did not publish is None.
    """

    uuid: str
    #: ``perfsweep_gpu_info``'s name (the reference server only; Triton names no GPU).
    name: str | None = None
    utilization_pct_mean: float | None = None
    utilization_pct_p95: float | None = None
    #: The utilisation samples behind mean and p95, percent.
    utilization_samples_pct: tuple[float, ...] = ()
    memory_used_peak_mb: float | None = None
    memory_total_mb: float | None = None
    power_mean_w: float | None = None
    power_limit_w: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out = dataclasses.asdict(self)
        out["utilization_samples_pct"] = list(self.utilization_samples_pct)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuStats:
        """Inverse of ``to_dict``."""
        kwargs = _known_fields(cls, data)
        kwargs["utilization_samples_pct"] = tuple(data.get("utilization_samples_pct", ()))
        return cls(**kwargs)


def utilization_summary(samples_pct: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and p95 (nearest rank, as the latency percentiles) of utilisation samples."""
    if not samples_pct:
        return None, None
    ordered = sorted(samples_pct)
    rank = max(int(0.95 * len(ordered) + 0.5), 1)
    return sum(ordered) / len(ordered), ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class ServerView:
    """What the server says about one window or level (deltas of its statistics and metrics).

    Times are averages per successful request in microseconds, as Triton's statistics report them.
    """

    success_count: int = 0
    failure_count: int = 0
    #: Failures from ``nv_inference_request_failure`` by ``reason`` (REJECTED, CANCELED, BACKEND, OTHER).
    failures_by_reason: dict[str, int] = field(default_factory=dict)
    inference_count: int = 0
    execution_count: int = 0
    #: inference_count / execution_count: how many requests (batch elements) each execution served.
    avg_batch_size: float = 0.0
    queue_us: float = 0.0
    compute_input_us: float = 0.0
    compute_infer_us: float = 0.0
    compute_output_us: float = 0.0
    #: Executions per batch size, from ``batch_stats``.
    batch_sizes: dict[int, int] = field(default_factory=dict)
    #: compute_infer summed over executions (``batch_stats``), microseconds: the time the model
    #: computed; over the window's length it is the busy share the statistics imply (the
    #: per-request ``compute_infer_us`` counts a batch's time once per request in it).
    execution_compute_infer_us: float = 0.0
    #: ``nv_inference_pending_request_count`` at the end (None when metrics were not available).
    pending_requests: int | None = None
    #: Per GPU the server reported (``nv_gpu_*``); empty when it reported none (CPU-only).
    gpus: tuple[GpuStats, ...] = ()
    #: Response-cache lookups in the window that hit / missed; 0 and 0: no lookups (no cache).
    cache_hit_count: int = 0
    cache_miss_count: int = 0
    #: A pipeline's composing models over the same window, by name (their own statistics:
    #: queue and compute per request, batches formed); empty for one model.
    stages: dict[str, ServerView] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (batch sizes keyed by strings, as JSON requires; ``stages`` only for
        a pipeline)."""
        out = dataclasses.asdict(self)
        out["batch_sizes"] = {str(k): v for k, v in sorted(self.batch_sizes.items())}
        out["gpus"] = [g.to_dict() for g in self.gpus]
        out["stages"] = {name: view.to_dict() for name, view in self.stages.items()}
        if not self.stages:
            del out["stages"]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerView:
        """Inverse of ``to_dict``."""
        kwargs = _known_fields(cls, data)
        kwargs["batch_sizes"] = {int(k): int(v) for k, v in data.get("batch_sizes", {}).items()}
        kwargs["failures_by_reason"] = dict(data.get("failures_by_reason", {}))
        kwargs["gpus"] = tuple(GpuStats.from_dict(g) for g in data.get("gpus", ()))
        kwargs["stages"] = {
            name: ServerView.from_dict(view) for name, view in data.get("stages", {}).items()
        }
        return cls(**kwargs)


@dataclass(frozen=True)
class WindowStats:
    """One measurement window."""

    index: int
    duration_s: float
    request_count: int
    error_count: int
    throughput_rps: float
    #: Latency as reported for this mode (from intended send time in open loop).
    p50_ms: float
    p99_ms: float
    mean_ms: float
    send_lag_p99_ms: float = 0.0
    #: Requests sent per second in this window (open loop: compare with the target rate).
    offered_rps: float = 0.0
    #: Generator CPU over the window, percent of one core per process, the busiest process.
    generator_cpu_pct: float = 0.0
    #: Most requests outstanding at once during the window.
    max_in_flight: int = 0
    server: ServerView | None = None
    #: A generative window: TTFT p99 over its requests and ITL p99 over its tokens, ms (None:
    #: requests answered once).
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the token figures only for a generative window)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["server"] = self.server.to_dict() if self.server else None
        for key in ("ttft_p99_ms", "itl_p99_ms"):
            if out[key] is None:
                out.pop(key)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowStats:
        """Inverse of ``to_dict``."""
        kwargs = _known_fields(cls, data)
        kwargs["server"] = ServerView.from_dict(data["server"]) if data.get("server") else None
        return cls(**kwargs)


@dataclass(frozen=True)
class ClassStats:
    """One traffic class of a load level (``[[traffic.classes]]``): its requests and latencies.

    Latencies are timed as the level's (``Measurement.latency_basis``); a request the server
    refused (a queue-timeout REJECT, a full queue) is an error of its class.
    """

    name: str
    #: Priority level the class's requests were sent with (0: none sent, the model's default).
    priority: int = 0
    #: Share of the offered load drawn into this class.
    share: float = 0.0
    #: ``timeout`` parameter sent with each request, microseconds (0: none sent).
    timeout_us: int = 0
    request_count: int = 0
    error_count: int = 0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    #: The model its requests went to, in a mix of models ("": the level's model).
    model: str = ""

    @property
    def error_rate(self) -> float:
        """Failed requests / requests of this class (0 when it got none)."""
        return self.error_count / self.request_count if self.request_count else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``model`` only in a mix of models)."""
        data = {**dataclasses.asdict(self), "error_rate": self.error_rate}
        if not self.model:
            data.pop("model")
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClassStats:
        """Inverse of ``to_dict``."""
        return cls(**_known_fields(cls, data))


@dataclass(frozen=True)
class Measurement:
    """The result of one load level: exact client-side latencies, self-checks, server view."""

    mode: LoadMode
    target: float
    throughput_rps: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    request_count: int
    error_count: int
    stable: bool
    valid: bool
    send_lag_p99_ms: float
    server: ServerView | None
    #: Open loop: the arrival process asked for, its short form (``poisson``, ``gamma:cv=2``,
    #: ``trace:requests.csv``; ``analyzer.measure.arrivals``); None in closed loop.
    arrival: str | None = None
    #: Open loop: the coefficient of variation of the gaps between the requests actually sent
    #: in the measured windows (all generator processes together): what was sent, beside
    #: ``offered_rps``. None in closed loop and in records written before it.
    send_gap_cv: float | None = None
    #: Open loop: the share of requests sent more than 1 ms after their intended time (how
    #: closely the schedule, a replayed trace's say, was kept). None as above.
    late_share_1ms: float | None = None
    p999_ms: float = 0.0
    mean_ms: float = 0.0
    max_ms: float = 0.0
    #: "intended_send" (open loop, coordinated-omission free) or "actual_send" (closed loop).
    latency_basis: str = "intended_send"
    #: Time from the actual send to the response (open loop; equals latency in closed loop).
    service_p50_ms: float = 0.0
    service_p99_ms: float = 0.0
    duration_s: float = 0.0
    #: Requests sent per second over the merged windows (open loop: should equal ``target``).
    offered_rps: float = 0.0
    generator_cpu_pct: float = 0.0
    max_in_flight: int = 0
    #: Error kinds -> counts (exception class and message head).
    errors: dict[str, int] = field(default_factory=dict)
    #: Why the result is invalid or unstable, each with what to do about it.
    messages: tuple[str, ...] = ()
    #: Why the level stopped before stabilising (fail-fast during capacity search), else None.
    stopped_early: str | None = None
    windows: tuple[WindowStats, ...] = ()
    protocol: str = "http"
    workers: int = 1
    #: The sequential test's verdict of this level (``LoadSpec.sequential``): n, the count over
    #: the goal, n_eff, the bounds and PASS/FAIL/BOUNDARY. None: a level measured to stability.
    step: StepRecord | None = None
    #: Per traffic class (``[[traffic.classes]]``), in the scenario's order; empty without a
    #: priority mix (and in records written before classes existed).
    classes: tuple[ClassStats, ...] = ()
    #: A generative model's token streams (TTFT, ITL, tokens/s, goodput); None for requests
    #: answered once (and in records written before streams were measured).
    tokens: TokenStats | None = None

    @property
    def error_rate(self) -> float:
        """Failed requests / all requests (0 when nothing was sent)."""
        total = self.request_count
        return self.error_count / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the per-level entry of ``perfsweep load --output``."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, enum.Enum):
                value = value.value
            out[f.name] = value
        out["server"] = self.server.to_dict() if self.server else None
        out["windows"] = [w.to_dict() for w in self.windows]
        out["messages"] = list(self.messages)
        out["step"] = self.step.to_dict() if self.step else None
        out["error_rate"] = self.error_rate
        if self.classes:
            out["classes"] = [c.to_dict() for c in self.classes]
        else:  # no mix: the record reads as before classes existed
            out.pop("classes")
        if self.tokens is not None:
            out["tokens"] = self.tokens.to_dict()
        else:
            out.pop("tokens")
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """Inverse of ``to_dict``."""
        kwargs = _known_fields(cls, data)
        kwargs["mode"] = LoadMode(data["mode"])
        kwargs["arrival"] = str(data["arrival"]) if data.get("arrival") else None
        kwargs["server"] = ServerView.from_dict(data["server"]) if data.get("server") else None
        kwargs["windows"] = tuple(WindowStats.from_dict(w) for w in data.get("windows", ()))
        kwargs["messages"] = tuple(data.get("messages", ()))
        kwargs["errors"] = dict(data.get("errors", {}))
        kwargs["step"] = StepRecord.from_dict(data["step"]) if data.get("step") else None
        kwargs["classes"] = tuple(ClassStats.from_dict(c) for c in data.get("classes") or ())
        kwargs["tokens"] = TokenStats.from_dict(data["tokens"]) if data.get("tokens") else None
        return cls(**kwargs)


_Point = TypeVar("_Point")


def gentlest(points: Iterable[_Point]) -> _Point | None:
    """The gentlest load level tried (lowest ``target``): the operating point a capacity search
    reports when no level met the goals, so the slack says by how much the config missed.

    ``points`` are :class:`Measurement` objects or their ``to_dict`` mappings; None when there
    are none. The one copy of this rule (:mod:`analyzer.config.objective` re-exports it).
    """

    def target(p: Any) -> float:
        return float(p.get("target", math.inf) if isinstance(p, Mapping) else p.target)

    return min(points, key=target, default=None)


def goals_dict(goals: Goals) -> dict[str, Any]:
    """``goals`` as JSON-ready data (``Goals(**goals_dict(g)) == g``); without class goals, the
    dict of records written before classes existed."""
    out = dataclasses.asdict(goals)
    if not math.isfinite(goals.p99_ms):
        out["p99_ms"] = None  # JSON has no infinity: token goals alone (Goals reads None back)
    for key in ("ttft_p99_ms", "itl_p99_ms"):
        if out[key] is None:  # no token goal: the dict of records written before them
            del out[key]
    if not goals.classes:
        out.pop("classes")
    else:
        out["classes"] = [list(pair) for pair in goals.classes]
    return out


def _known_fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}
