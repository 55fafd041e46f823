"""Measurement records and the pure logic around them: latency summaries, stability, capacity search.

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
  of ``p99 <= goal`` (:mod:`analyzer.measure.stepping`) decides PASS or FAIL, or at its cap (BOUNDARY);
  its :class:`~analyzer.measure.stepping.StepRecord` is ``Measurement.step``. Stability is then a check
  recorded on the measurement, not the stopping rule.
* *valid*: the generator kept up (achieved rate, send lag, CPU); an invalid result says how to fix it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
from hdrh.histogram import HdrHistogram

from analyzer.documents import FORMATS, LOAD_KIND, header
from analyzer.errors import InputError, ResultFormatError
from analyzer.measure.stepping import StepRecord, StepTest, StepVerdict

#: Histogram range in microseconds: 1 µs .. 10 minutes. Larger values are clamped, never dropped.
HIST_LOWEST_US = 1
HIST_HIGHEST_US = 600_000_000
HIST_SIGNIFICANT_FIGURES = 3


class LoadMode(str, enum.Enum):
    """How load is offered."""

    #: Closed loop: N requests always outstanding (perf_analyzer ``--concurrency-range``).
    #: Latency is timed from the actual send, so a server stall is under-reported (coordinated omission).
    CONCURRENCY = "concurrency"
    #: Open loop: requests are sent on a schedule regardless of responses; latency is timed from the
    #: intended send time, so a stall shows in the tail.
    REQUEST_RATE = "request_rate"


class Arrival(str, enum.Enum):
    """Inter-arrival distribution of an open-loop schedule."""

    CONSTANT = "constant"
    POISSON = "poisson"


# --------------------------------------------------------------------------------------------------
# Exact latencies


def new_histogram() -> HdrHistogram:
    """Return an empty latency histogram in microseconds with perfsweep's standard range."""
    return HdrHistogram(HIST_LOWEST_US, HIST_HIGHEST_US, HIST_SIGNIFICANT_FIGURES)


def record_us(hist: HdrHistogram, value_us: float) -> None:
    """Record one latency, clamped into the histogram's range.

    ``HdrHistogram.record_value`` silently drops out-of-range values; a latency is never dropped
    here: anything above the range counts as the range's maximum.
    """
    hist.record_value(min(max(int(value_us), HIST_LOWEST_US), HIST_HIGHEST_US))


def merge_encoded(blobs: Iterable[str]) -> HdrHistogram:
    """Merge encoded histograms (``HdrHistogram.encode()``, e.g. shipped from workers) into one."""
    total = new_histogram()
    for blob in blobs:
        if blob:
            total.decode_and_add(blob)
    return total


def merge_histograms(hists: Iterable[HdrHistogram]) -> HdrHistogram:
    """Merge histograms into a new one (exact: same bucket layout everywhere)."""
    total = new_histogram()
    for hist in hists:
        total.add(hist)
    return total


@functools.cache
def _bucket_values() -> tuple[np.ndarray, np.ndarray]:
    """Highest- and median-equivalent value of every counts index (same layout for all histograms)."""
    h = new_histogram()
    lowest = [h.get_value_from_index(i) for i in range(h.counts_len)]
    highest = np.array([h.get_highest_equivalent_value(v) for v in lowest], dtype=np.float64)
    median = np.array([h._hdr_median_equiv_value(v) for v in lowest], dtype=np.float64)
    return highest, median


def percentiles_us(hist: HdrHistogram, percentiles: Sequence[float]) -> dict[float, float]:
    """``HdrHistogram.get_value_at_percentile`` for several percentiles at once, vectorised.

    hdrh walks its 17k counters in pure Python (~50 ms per summary), which would stall the
    gevent hub and show up as send lag; numpy over the same counters gives identical values.
    """
    total = hist.get_total_count()
    if total == 0:
        return {p: 0.0 for p in percentiles}
    counts = np.ctypeslib.as_array(hist.counts)[: hist.counts_len]
    cumulative = np.cumsum(counts)
    highest, _ = _bucket_values()
    out = {}
    for p in percentiles:
        target = max(int(min(p, 100.0) * total / 100 + 0.5), 1)
        index = int(np.searchsorted(cumulative, target, side="left"))
        out[p] = float(highest[min(index, len(highest) - 1)])
    return out


def count_above_us(hist: HdrHistogram, value_us: float) -> int:
    """How many recorded values are above ``value_us`` (to bucket precision)."""
    if hist.get_total_count() == 0:
        return 0
    counts = np.ctypeslib.as_array(hist.counts)[: hist.counts_len]
    highest, _ = _bucket_values()
    return int(counts[highest > value_us].sum())


def mean_us(hist: HdrHistogram) -> float:
    """``HdrHistogram.get_mean_value``, vectorised."""
    total = hist.get_total_count()
    if total == 0:
        return 0.0
    counts = np.ctypeslib.as_array(hist.counts)[: hist.counts_len]
    _, median = _bucket_values()
    return float(np.dot(counts.astype(np.float64), median) / total)


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles of one latency distribution, in milliseconds."""

    count: int = 0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    p999_ms: float = 0.0
    mean_ms: float = 0.0
    max_ms: float = 0.0

    @classmethod
    def from_histogram(cls, hist: HdrHistogram) -> LatencySummary:
        """Summarise a microsecond histogram (an empty one gives all zeros)."""
        count = hist.get_total_count()
        if count == 0:
            return cls()
        pct = percentiles_us(hist, [50, 90, 95, 99, 99.9])
        return cls(
            count=count,
            p50_ms=pct[50] / 1000.0,
            p90_ms=pct[90] / 1000.0,
            p95_ms=pct[95] / 1000.0,
            p99_ms=pct[99] / 1000.0,
            p999_ms=pct[99.9] / 1000.0,
            mean_ms=mean_us(hist) / 1000.0,
            max_ms=hist.get_max_value() / 1000.0,
        )


# --------------------------------------------------------------------------------------------------
# Specs


@dataclass(frozen=True)
class Goals:
    """What a load level must achieve to count as meeting the service-level objective."""

    #: Client-side p99 latency limit, milliseconds.
    p99_ms: float
    #: Highest tolerated fraction of failed requests (0.01 = 1 %); with traffic classes, of
    #: each class's requests.
    max_error_rate: float = 0.0
    #: ``(class name, p99 goal ms)`` of the traffic classes with a goal of their own
    #: (``TrafficSection.class_goals()``); any other class is held to ``p99_ms``.
    classes: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not self.p99_ms > 0:
            raise InputError(f"p99 goal must be positive, got {self.p99_ms} ms")
        if not 0 <= self.max_error_rate < 1:
            raise InputError(
                f"error-rate goal must be in [0, 1), got {self.max_error_rate}; pass a fraction"
            )
        # A record read back from JSON has lists; the frozen object holds tuples.
        classes = tuple((str(name), float(goal)) for name, goal in self.classes)
        object.__setattr__(self, "classes", classes)
        for name, goal in classes:
            if not goal > 0:
                raise InputError(f"p99 goal of class {name!r} must be positive, got {goal} ms")
            if goal > self.p99_ms:
                # The overall p99 is judged against p99_ms (a sequential step's test, the
                # fail-fast rule): it must be the loosest goal, or it fails levels that every
                # class passes.
                raise InputError(
                    f"p99 goal of class {name!r} ({goal:g} ms) is above the run's p99 goal "
                    f"({self.p99_ms:g} ms): make goals.p99_ms the loosest goal (the rest of "
                    "the traffic) and give the stricter classes their own p99_ms"
                )

    def class_p99_ms(self, name: str) -> float:
        """The p99 goal of traffic class ``name``: its own, else ``p99_ms``."""
        return next((goal for n, goal in self.classes if n == name), self.p99_ms)


@dataclass(frozen=True)
class LoadSpec:
    """One load level and how to measure it."""

    mode: LoadMode
    #: Concurrency (requests outstanding) in closed-loop mode, requests/second in open-loop mode.
    target: float
    arrival: Arrival = Arrival.POISSON
    #: Warm-up before the first window; its requests are never part of any result.
    warmup_s: float = 1.0
    #: Window length in seconds (time windows). Ignored when ``window_requests`` is set.
    window_s: float = 3.0
    #: Window length in completed requests (count windows); each window also lasts >= ``min_window_s``.
    window_requests: int | None = None
    min_window_s: float = 1.0
    #: Stability rule: the last ``stable_windows`` windows agree within this percentage.
    stability_pct: float = 10.0
    stable_windows: int = 3
    #: At most this many windows per level; a level that has not stabilised by then is marked unstable.
    max_windows: int = 10
    #: Seed of the arrival schedule and of random input data.
    seed: int = 0
    #: When set, stop the level early once it clearly fails these goals (capacity search).
    fail_fast: Goals | None = None
    #: Upper bound on requests in flight (open loop); beyond it the level fails fast when
    #: ``fail_fast`` is set. ``None``: derived from the rate (see ``in_flight_bound``).
    max_in_flight: int | None = None
    #: When set, the level is a sequential step: it stops as soon as this test decides
    #: ``p{quantile} <= goal_ms`` (PASS or FAIL), else at ``sequential.max_requests`` or at
    #: ``max_windows`` windows, whichever comes first (BOUNDARY). Its verdict is
    #: ``Measurement.step``; the stability rule is then a recorded check, not the stopping rule.
    #: In a capacity search (``CapacitySpec.step``) the goal is the search's ``goals.p99_ms``,
    #: and only the first step after the config load keeps ``warmup_s``. None: today's stopping.
    sequential: StepTest | None = None

    def __post_init__(self) -> None:
        if not self.target > 0:
            raise InputError(f"load target must be positive, got {self.target}")
        if self.mode is LoadMode.CONCURRENCY and self.target != int(self.target):
            raise InputError(f"concurrency must be a whole number, got {self.target}")
        if self.window_requests is None and not self.window_s > 0:
            raise InputError(f"--window-s must be positive, got {self.window_s}")
        if self.window_requests is not None and self.window_requests < 1:
            raise InputError(f"--window-requests must be >= 1, got {self.window_requests}")
        if self.stable_windows < 1 or self.max_windows < self.stable_windows:
            raise InputError(
                f"max_windows ({self.max_windows}) must be >= stable_windows ({self.stable_windows}) >= 1"
            )

    def in_flight_bound(self) -> int:
        """Requests allowed in flight before an open-loop level counts as overloaded.

        Little's law: in-flight = rate x latency. At the goal's p99 the in-flight count is about
        ``rate * p99``; four times that (at least 64) means the server is clearly not keeping up.
        """
        if self.max_in_flight is not None:
            return self.max_in_flight
        p99_s = (self.fail_fast.p99_ms if self.fail_fast else 1000.0) / 1000.0
        return max(64, math.ceil(4 * self.target * p99_s))


@dataclass(frozen=True)
class CapacitySpec:
    """Find the highest open-loop request rate that meets ``goals``."""

    goals: Goals
    #: First rate tried; the search doubles from here until a rate fails.
    start_rps: float = 10.0
    #: Never offer more than this.
    max_rps: float = 100_000.0
    #: When even ``start_rps`` fails the search descends, but not below this.
    min_rps: float = 1.0
    #: Bisection stops when the bracket is narrower than this fraction of its lower end.
    resolution: float = 0.05
    #: Bracketing growth factor.
    growth: float = 2.0
    #: Template for every step (mode and target are overridden by the search).
    step: LoadSpec = field(
        default_factory=lambda: LoadSpec(LoadMode.REQUEST_RATE, 1.0, window_s=2.0, max_windows=4)
    )
    #: Wait at most this long for the server to drain (pending requests back to 0) between steps.
    drain_timeout_s: float = 30.0
    #: Repeat a failing step once before it counts (real servers have rare outliers).
    confirm_failures: bool = False
    #: A rate already seen failing (validation: the winner's failed check): the search starts
    #: bracketed below it instead of growing past it.
    fails_at_rps: float | None = None
    #: The search checks a forecast instead of searching for it: ``start_rps`` (below the
    #: forecast) must pass and ``start_rps * growth`` (above it) must fail, and then the search
    #: is over with that bracket, whatever ``resolution`` says. Any other outcome (the forecast
    #: was wrong, by an amount it cannot tell) goes on as a full search: steps of
    #: :data:`FULL_SEARCH_GROWTH`, then bisection to ``resolution``.
    forecast_check: bool = False

    def __post_init__(self) -> None:
        if self.fails_at_rps is not None and not self.start_rps < self.fails_at_rps:
            raise InputError(
                f"capacity search starting at {self.start_rps} req/s cannot be bounded by a "
                f"failing rate {self.fails_at_rps} req/s at or below it"
            )
        if not 0 < self.min_rps <= self.start_rps <= self.max_rps:
            raise InputError(
                f"capacity search needs 0 < min ({self.min_rps}) <= start ({self.start_rps}) "
                f"<= max ({self.max_rps}) req/s"
            )
        if not 0 < self.resolution < 1:
            raise InputError(f"resolution must be a fraction in (0, 1), got {self.resolution}")
        if not self.growth > 1:
            raise InputError(f"growth must be > 1, got {self.growth}")


# --------------------------------------------------------------------------------------------------
# Results


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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (batch sizes keyed by strings, as JSON requires)."""
        out = dataclasses.asdict(self)
        out["batch_sizes"] = {str(k): v for k, v in sorted(self.batch_sizes.items())}
        out["gpus"] = [g.to_dict() for g in self.gpus]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServerView:
        """Inverse of ``to_dict``."""
        kwargs = _known_fields(cls, data)
        kwargs["batch_sizes"] = {int(k): int(v) for k, v in data.get("batch_sizes", {}).items()}
        kwargs["failures_by_reason"] = dict(data.get("failures_by_reason", {}))
        kwargs["gpus"] = tuple(GpuStats.from_dict(g) for g in data.get("gpus", ()))
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["server"] = self.server.to_dict() if self.server else None
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

    @property
    def error_rate(self) -> float:
        """Failed requests / requests of this class (0 when it got none)."""
        return self.error_count / self.request_count if self.request_count else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {**dataclasses.asdict(self), "error_rate": self.error_rate}

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
    arrival: Arrival | None = None
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
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """Inverse of ``to_dict``."""
        kwargs = _known_fields(cls, data)
        kwargs["mode"] = LoadMode(data["mode"])
        kwargs["arrival"] = Arrival(data["arrival"]) if data.get("arrival") else None
        kwargs["server"] = ServerView.from_dict(data["server"]) if data.get("server") else None
        kwargs["windows"] = tuple(WindowStats.from_dict(w) for w in data.get("windows", ()))
        kwargs["messages"] = tuple(data.get("messages", ()))
        kwargs["errors"] = dict(data.get("errors", {}))
        kwargs["step"] = StepRecord.from_dict(data["step"]) if data.get("step") else None
        kwargs["classes"] = tuple(ClassStats.from_dict(c) for c in data.get("classes") or ())
        return cls(**kwargs)


@dataclass(frozen=True)
class CapacityResult:
    """Highest request rate that met the goals, and every point tried on the way."""

    goals: Goals
    #: Highest passing rate, requests/second; 0.0 when even the first step failed.
    capacity_rps: float
    #: Every step, in the order it ran.
    points: tuple[Measurement, ...]
    #: The measurement at ``capacity_rps`` (None when nothing passed).
    best: Measurement | None
    #: True when the search bracketed the capacity (a failing rate was found above a passing one).
    bracketed: bool
    message: str = ""
    #: The step at ``capacity_rps`` was sequential and ended at the boundary (BOUNDARY): its p99
    #: is within the test's resolution of the goal, neither shown below nor above it.
    at_boundary: bool = False
    #: A rate known to fail before the search (``CapacitySpec.fails_at_rps``: a validation
    #: check that failed there), which bounds the capacity as a failing point would.
    fails_at_rps: float | None = None

    @property
    def lowest_fail_rps(self) -> float | None:
        """The lowest rate above the capacity known to fail (a failing point, or
        :attr:`fails_at_rps`); None when every rate offered met the goals."""
        failing = [
            p.target
            for p in self.points
            if p.target > self.capacity_rps and not meets_goals(p, self.goals)[0]
        ]
        if self.fails_at_rps is not None and self.fails_at_rps > self.capacity_rps:
            failing.append(self.fails_at_rps)
        return min(failing, default=None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out = {
            "goals": goals_dict(self.goals),
            "capacity_rps": self.capacity_rps,
            "bracketed": self.bracketed,
            "at_boundary": self.at_boundary,
            "message": self.message,
            "best": self.best.to_dict() if self.best else None,
            "points": [p.to_dict() for p in self.points],
        }
        if self.fails_at_rps is not None:
            out["fails_at_rps"] = self.fails_at_rps
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityResult:
        """Inverse of ``to_dict``."""
        return cls(
            goals=Goals(**data["goals"]),
            capacity_rps=float(data["capacity_rps"]),
            points=tuple(Measurement.from_dict(p) for p in data["points"]),
            best=Measurement.from_dict(data["best"]) if data.get("best") else None,
            bracketed=bool(data["bracketed"]),
            message=str(data.get("message", "")),
            at_boundary=bool(data.get("at_boundary", False)),
            fails_at_rps=data.get("fails_at_rps"),
        )


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
    if not goals.classes:
        out.pop("classes")
    else:
        out["classes"] = [list(pair) for pair in goals.classes]
    return out


def load_output_dict(
    measurements: Sequence[Measurement],
    capacity: CapacityResult | None = None,
    environment: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The versioned document ``perfsweep load --output`` writes."""
    doc: dict[str, Any] = {
        **header(LOAD_KIND),
        "environment": dict(environment or {}),
        "results": [m.to_dict() for m in measurements],
    }
    if capacity is not None:
        doc["capacity_rps"] = capacity.capacity_rps
        doc["capacity"] = capacity.to_dict()
    return doc


def read_load_output(doc: Mapping[str, Any]) -> tuple[list[Measurement], CapacityResult | None]:
    """Parse a ``perfsweep load --output`` document; refuse versions this build cannot read."""
    version, fmt = doc.get("format_version"), FORMATS[LOAD_KIND]
    if doc.get("kind") != LOAD_KIND or not fmt.readable(version):
        raise ResultFormatError(
            f"not a perfsweep load result of format {fmt.current} "
            f"(kind={doc.get('kind')!r}, format_version={version!r}); "
            "re-run `perfsweep load` with this version or use the perfsweep that wrote it"
        )
    doc = fmt.lift(doc, LOAD_KIND)
    measurements = [Measurement.from_dict(m) for m in doc["results"]]
    capacity = CapacityResult.from_dict(doc["capacity"]) if doc.get("capacity") else None
    return measurements, capacity


def _known_fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


class LoadGenerator(Protocol):
    """The seam between the measurement engine and its users (sweep, CLI).

    ``analyzer.load.LocustLoadGenerator`` is the real one; tests of search/report/gate logic use
    a fake that computes results from a formula.
    """

    def measure(self, spec: LoadSpec) -> Measurement:
        """Measure one load level."""
        ...

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        """Find the highest open-loop request rate that meets ``spec.goals``."""
        ...


# --------------------------------------------------------------------------------------------------
# Stability and goals


def is_stable(windows: Sequence[WindowStats], stability_pct: float = 10.0, needed: int = 3) -> bool:
    """perf_analyzer's rule: the last ``needed`` windows agree on throughput and p99.

    Agreement means max/min <= 1 + stability_pct/100 for both; a window with no completed request
    (zero throughput) is never stable.
    """
    if len(windows) < needed:
        return False
    last = windows[-needed:]
    limit = 1.0 + stability_pct / 100.0
    for values in ([w.throughput_rps for w in last], [w.p99_ms for w in last]):
        low, high = min(values), max(values)
        if low <= 0 or high / low > limit:
            return False
    return True


@dataclass(frozen=True)
class GeneratorLimits:
    """Above these the generator, not the server, decided a measurement (it is then invalid)."""

    #: Busiest generator process's CPU over a window, percent of one core.
    max_cpu_pct: float = 90.0
    #: A request sent later than this after its intended time counts as late.
    max_send_lag_ms: float = 10.0
    #: Late requests tolerated: this fraction of those sent (and always at least 2).
    max_late_fraction: float = 0.01
    #: Open loop: requests offered must reach this fraction of the schedule (beyond Poisson noise).
    min_offered_ratio: float = 0.95


def generator_problems(
    limits: GeneratorLimits,
    open_loop: bool,
    cpu_pct: float,
    sent: int,
    late: int,
    expected_sent: float,
    arrival: Arrival,
) -> list[str]:
    """Why a measurement is invalid (empty when the generator kept up).

    Args:
        limits: the thresholds.
        open_loop: request-rate mode (lag and offered-rate rules apply only there).
        cpu_pct: busiest generator process's CPU, percent of one core.
        sent: requests dispatched in the measured windows.
        late: how many of them left more than ``limits.max_send_lag_ms`` after their intended time.
        expected_sent: requests the schedule asked for in those windows (0: skip that rule).
        arrival: the schedule's distribution (Poisson counts vary by sqrt(n)).
    """
    problems = []
    if cpu_pct > limits.max_cpu_pct:
        problems.append(f"generator CPU {cpu_pct:.0f}% of a core > {limits.max_cpu_pct:g}%")
    if not open_loop:
        return problems
    # One OS scheduling hiccup on a busy machine is not saturation: with few samples p99 is the
    # maximum, so the rule counts late requests rather than reading the lag's p99.
    if late > max(limits.max_late_fraction * sent, 2):
        problems.append(f"{late} of {sent} requests sent over {limits.max_send_lag_ms:g} ms late")
    if expected_sent > 0:
        if arrival is Arrival.CONSTANT:
            slack = (1 - limits.min_offered_ratio) * expected_sent + 2
        else:  # only a shortfall beyond 3 sigma of a Poisson count is the generator's
            slack = max(
                (1 - limits.min_offered_ratio) * expected_sent, 3 * math.sqrt(expected_sent)
            )
        if sent < expected_sent - slack:
            problems.append(
                f"offered {sent} requests where the schedule asked for {expected_sent:.0f}"
            )
    return problems


def unusable(m: Measurement) -> str | None:
    """Why ``m`` cannot be judged against any goal (None when it can).

    A measurement in which nothing completed, or whose generator was saturated (``valid`` is
    False), describes the load generator, not the server.
    """
    if m.request_count == 0:
        return "no request completed"
    if not m.valid:
        return "invalid measurement (generator saturated)"
    return None


def goals_met(problem: str | None, slacks: Mapping[str, float]) -> bool:
    """The one rule behind every "meets the goals" in perfsweep.

    A result meets the goals when the measurement it rests on is usable (``problem`` is None,
    see :func:`unusable`) and every slack is satisfied (<= 0). :func:`meets_goals` (one load
    level) and the sweep's trial records (``TrialRecord.meets_goals``, whatever the objective)
    both apply it.
    """
    return problem is None and all(v <= 0 for v in slacks.values())


def goal_slacks(p99_ms: float, error_rate: float, goals: Goals) -> dict[str, float]:
    """Continuous slacks of one level against ``goals`` (<= 0: satisfied)."""
    return {
        "p99_slack": (p99_ms - goals.p99_ms) / goals.p99_ms,
        "err_slack": error_rate - goals.max_error_rate,
    }


def meets_goals(m: Measurement, goals: Goals) -> tuple[bool, str]:
    """Whether a measurement meets ``goals``, and a one-line reason either way.

    An invalid measurement (saturated generator) never meets a goal: its numbers describe the
    generator, not the server. The verdict is :func:`goals_met` on :func:`unusable` and
    :func:`goal_slacks`; a level stopped early (capacity search) is unusable too.

    A sequential step (``m.step``, its goal that of ``goals``) is judged on the latency goal by
    its test, not by its point p99: PASS meets it, FAIL misses it. BOUNDARY (undecided at its
    cap) is judged on its point p99, as a fixed-window level is: an undecided test may mean "near
    the goal" (the request cap reached) but also "too few effective samples" (the window cap
    reached under heavy autocorrelation), and a p99 of twice the goal must not pass for want of
    evidence. A BOUNDARY step whose point p99 meets the goal meets it *at the boundary*.
    The error-rate goal and usability apply as for any level.

    With traffic classes (``m.classes``) a level meets the goals only when every class meets
    its own p99 goal (:meth:`Goals.class_p99_ms`) and the error budget on its own requests
    (:func:`class_slacks`). The sequential test stays on the overall p99 against
    ``goals.p99_ms`` (one test per step): FAIL misses the goals, while PASS and BOUNDARY are
    then judged class by class on the classes' point p99s.
    """
    problem = unusable(m)
    if problem is None and m.stopped_early is not None:
        problem = f"stopped early: {m.stopped_early}"
    step = sequential_verdict(m, goals)
    per_class = class_slacks(m, goals)
    if per_class:
        return _meets_class_goals(m, goals, problem, step, per_class)
    if step is not None:
        slacks = {**goal_slacks(m.p99_ms, m.error_rate, goals), "p99_slack": p99_slack(m, goals)}
        if goals_met(problem, slacks):
            where = "at the boundary of" if step is StepVerdict.BOUNDARY else "meets"
            return True, (
                f"p99 {m.p99_ms:.2f} ms {where} the goal {goals.p99_ms:g} ms (sequential test: "
                f"{step.value}), error rate {m.error_rate:.2%}"
            )
        if problem is not None:
            return False, problem
        if step is StepVerdict.FAIL:
            return False, (
                f"p99 {m.p99_ms:.2f} ms over the goal {goals.p99_ms:g} ms (sequential test: fail)"
            )
        if m.p99_ms > goals.p99_ms:
            return False, (
                f"p99 {m.p99_ms:.2f} ms > goal {goals.p99_ms:g} ms (sequential test undecided at "
                "its cap: judged on the point p99)"
            )
        return False, f"error rate {m.error_rate:.2%} > goal {goals.max_error_rate:.2%}"
    if goals_met(problem, goal_slacks(m.p99_ms, m.error_rate, goals)):
        return True, f"p99 {m.p99_ms:.2f} ms <= {goals.p99_ms:g} ms, error rate {m.error_rate:.2%}"
    if problem is not None:
        return False, problem
    if m.p99_ms > goals.p99_ms:
        return False, f"p99 {m.p99_ms:.2f} ms > goal {goals.p99_ms:g} ms"
    return False, f"error rate {m.error_rate:.2%} > goal {goals.max_error_rate:.2%}"


def _meets_class_goals(
    m: Measurement,
    goals: Goals,
    problem: str | None,
    step: StepVerdict | None,
    per_class: Mapping[str, Mapping[str, float]],
) -> tuple[bool, str]:
    """:func:`meets_goals` of a level with traffic classes."""
    slacks = {"p99_slack": p99_slack(m, goals), "err_slack": error_slack(m, goals)}
    test = f" (sequential test on the overall p99: {step.value})" if step is not None else ""
    if goals_met(problem, slacks):
        where = "at the boundary of" if step is StepVerdict.BOUNDARY else "meets"
        parts = ", ".join(
            f"{c.name} p99 {c.p99_ms:.2f} ms <= {goals.class_p99_ms(c.name):g} ms"
            for c in m.classes
            if c.request_count
        )
        return True, f"every class {where} its goal: {parts}{test}"
    if problem is not None:
        return False, problem
    if step is StepVerdict.FAIL:
        return False, (
            f"p99 {m.p99_ms:.2f} ms over the goal {goals.p99_ms:g} ms (sequential test: fail)"
        )
    by_name = {c.name: c for c in m.classes}
    name, worst = max(per_class.items(), key=lambda kv: kv[1]["p99_slack"])
    if worst["p99_slack"] > 0:
        c = by_name[name]
        return False, (
            f"class {name}: p99 {c.p99_ms:.2f} ms > goal {goals.class_p99_ms(name):g} ms{test}"
        )
    name, worst = max(per_class.items(), key=lambda kv: kv[1]["err_slack"])
    c = by_name[name]
    return False, (
        f"class {name}: error rate {c.error_rate:.2%} > goal {goals.max_error_rate:.2%}"
        f" ({c.error_count} of {c.request_count} failed)"
    )


def class_slacks(m: Measurement, goals: Goals) -> dict[str, dict[str, float]]:
    """Per traffic class that got requests: its ``p99_slack`` against its own goal and its
    ``err_slack`` against the error budget (<= 0: satisfied). Empty without classes."""
    out: dict[str, dict[str, float]] = {}
    for c in m.classes:
        if c.request_count:
            goal = goals.class_p99_ms(c.name)
            out[c.name] = {
                "p99_slack": (c.p99_ms - goal) / goal,
                "err_slack": c.error_rate - goals.max_error_rate,
            }
    return out


def error_slack(m: Measurement, goals: Goals) -> float:
    """``error rate - allowed rate`` of one level: the worst class's with traffic classes (a
    class the server refuses fails however small its share), else the level's."""
    overall = m.error_rate - goals.max_error_rate
    per_class = class_slacks(m, goals)
    return max([overall, *(s["err_slack"] for s in per_class.values())])


def classes_text(m: Measurement, goals: Goals) -> str:
    """One line of ``m``'s traffic classes for the console: each class's p99 against its own
    goal, and its errors when it had any (``""`` without classes)::

        urgent p99 9.0/12.5 ms, bulk p99 22.0/25 ms (40 errors, 5.0%)
    """
    parts = []
    for c in m.classes:
        text = f"{c.name} p99 {c.p99_ms:.1f}/{goals.class_p99_ms(c.name):g} ms"
        if c.error_count:
            text += f" ({c.error_count} errors, {c.error_rate:.1%})"
        parts.append(text)
    return ", ".join(parts)


#: A sequential FAIL whose point p99 is not above the goal still gets this (tiny) positive slack.
FAIL_SLACK_FLOOR = 1e-6


def p99_slack(m: Measurement, goals: Goals) -> float:
    """``(p99 - goal) / goal`` of one level, with a sequential step's verdict over its point p99.

    PASS gives at most 0, FAIL at least ``FAIL_SLACK_FLOOR``, BOUNDARY (undecided) its point
    p99's slack, as a fixed-window level. Anything that turns a trial's operating point into a p99 slack (the
    sweep's constraints) should use this, so it agrees with :func:`meets_goals`.

    With traffic classes it is the worst class's slack against its own goal
    (:func:`class_slacks`); the sequential test is of the overall p99, so FAIL still gives at
    least ``FAIL_SLACK_FLOOR``, while PASS and BOUNDARY leave the classes' point slacks.
    """
    verdict = sequential_verdict(m, goals)
    per_class = class_slacks(m, goals)
    if per_class:
        worst = max(s["p99_slack"] for s in per_class.values())
        return max(worst, FAIL_SLACK_FLOOR) if verdict is StepVerdict.FAIL else worst
    raw = (m.p99_ms - goals.p99_ms) / goals.p99_ms
    if verdict is None:
        return raw
    if verdict is StepVerdict.FAIL:
        return max(raw, FAIL_SLACK_FLOOR)
    if verdict is StepVerdict.BOUNDARY:
        return raw
    return min(raw, 0.0)


def sequential_verdict(m: Measurement, goals: Goals) -> StepVerdict | None:
    """The final verdict of ``m``'s sequential test when it tested ``goals.p99_ms`` at p99.

    None when ``m`` was not a sequential step, its test was about another goal or quantile (a
    record judged against other goals is judged on its p99), or it has no final verdict.
    """
    step = m.step
    if step is None or not step.verdict.final or step.goal_ms != goals.p99_ms:
        return None
    if not math.isclose(step.target_share, 0.01, rel_tol=1e-9):
        return None
    return step.verdict


def clearly_fails(
    latency_p90_ms: float,
    request_count: int,
    error_count: int,
    in_flight: int,
    goals: Goals,
    in_flight_bound: int,
    min_requests: int = 50,
    *,
    latency_rule: bool = True,
) -> str | None:
    """Whether a level in progress has already failed its goals, so it can stop early.

    Returns the reason, or None to keep measuring. Used by capacity search so an overloaded step
    ends quickly (and leaves less backlog for the next step to inherit). "Clearly" means
    systematic: the backlog passed its bound, or at least 10 % of the requests so far (p90) are
    beyond the p99 goal. A p99 over the goal alone is not enough, since with a few hundred
    samples it is one or two outliers (a machine hiccup), which the full level may absorb.

    ``latency_rule=False`` (a sequential step) leaves out the p90 rule: the step's sequential
    test owns the latency verdict (and, unlike a p90 over 50 requests, accounts for a burst
    putting many consecutive requests over the goal); the backlog and error-rate guards stay.
    """
    if in_flight > in_flight_bound:
        return f"{in_flight} requests in flight > bound {in_flight_bound}"
    if request_count >= min_requests:
        if latency_rule and latency_p90_ms > goals.p99_ms:
            return f"p90 {latency_p90_ms:.1f} ms already beyond the p99 goal {goals.p99_ms:g} ms"
        if goals.max_error_rate < 1 and error_count / request_count > max(
            goals.max_error_rate * 2, 0.05
        ):
            return f"error rate {error_count / request_count:.1%} already beyond goal"
    return None


# --------------------------------------------------------------------------------------------------
# Capacity search (pure state machine: the engine asks for the next rate and reports pass/fail)


#: Bracketing growth of a search whose forecast check disagreed with the forecast: a looser
#: guess than a prediction, as a neighbour's capacity is, without dropping to rates where one
#: step takes many times longer.
FULL_SEARCH_GROWTH = 1.5


class CapacitySearch:
    """Bracket upward from a low rate, then bisect to a relative resolution.

    Usage::

        search = CapacitySearch(spec)
        while (rate := search.next_rate()) is not None:
            search.record(rate, passed=run_step(rate))
        search.capacity_rps

    Bracketing multiplies the rate by ``growth`` while it passes (up to ``max_rps``). Once a rate
    fails, bisection runs between the highest pass and the lowest fail until the gap is at most
    ``resolution`` x the lower end. A failing first step divides the rate by ``growth`` until one
    passes (then bisects) or the rate would drop below ``min_rps``. ``spec.fails_at_rps`` is a
    failure known beforehand: the search starts with it as the lowest failing rate.
    ``spec.forecast_check``: a pass at ``start_rps`` then a fail at ``start_rps * growth`` ends
    the search (:attr:`confirmed`); any other first outcome makes it a full search with growth
    :data:`FULL_SEARCH_GROWTH`.

    A sequential step that ends undecided at its cap (BOUNDARY) passes or fails on its point p99
    (:func:`meets_goals`); one that passes is recorded with ``boundary=True``, and the result
    says so (:attr:`at_boundary`): its capacity rests on the point estimate, not on the test.
    """

    def __init__(self, spec: CapacitySpec) -> None:
        self.spec = spec
        self.highest_pass: float | None = None
        self.lowest_fail: float | None = spec.fails_at_rps
        self.history: list[tuple[float, bool]] = []
        self._boundary: dict[float, bool] = {}
        self._next: float | None = spec.start_rps
        self._growth = spec.growth
        #: The forecast check ended as forecast: a pass below it, a fail above it.
        self.confirmed = False

    @property
    def capacity_rps(self) -> float:
        """Highest passing rate so far (0.0 when none passed)."""
        return self.highest_pass or 0.0

    @property
    def bracketed(self) -> bool:
        """A failing rate above the highest passing one has been found."""
        return self.lowest_fail is not None and self.highest_pass is not None

    def next_rate(self) -> float | None:
        """The next rate to measure, or None when the search is done."""
        return self._next

    @property
    def at_boundary(self) -> bool:
        """The highest passing rate passed at the boundary (a BOUNDARY sequential step)."""
        return self.highest_pass is not None and self._boundary.get(self.highest_pass, False)

    def record(self, rate: float, passed: bool, *, boundary: bool = False) -> None:
        """Report the verdict for ``rate`` (the value ``next_rate`` returned); ``boundary``: it
        passed at the boundary (a BOUNDARY sequential step, counted as passed)."""
        self.history.append((rate, passed))
        if passed:
            self._boundary[rate] = boundary
        if passed:
            self.highest_pass = max(rate, self.highest_pass or 0.0)
        else:
            self.lowest_fail = rate if self.lowest_fail is None else min(rate, self.lowest_fail)
        self._next = self._decide()

    def _decide(self) -> float | None:
        spec = self.spec
        if spec.forecast_check and self._growth == spec.growth:
            outcomes = [passed for _, passed in self.history]
            if outcomes == [True, False]:
                self.confirmed = True
                return None
            if outcomes != [True]:  # the forecast was wrong: by how much, nothing tells yet
                self._growth = FULL_SEARCH_GROWTH
        low, high = self.highest_pass, self.lowest_fail
        if high is None:  # still bracketing upwards
            assert low is not None
            if low >= spec.max_rps:
                return None
            return min(low * self._growth, spec.max_rps)
        if low is None:  # even the lowest rate failed: search below it
            candidate = high / self._growth
            return candidate if candidate >= spec.min_rps else None
        # A relative tolerance: a bracket grown in steps of exactly 1 + resolution (a search
        # from a prediction: EXPECTED_GROWTH) is done, whatever the rounding of the product says.
        if high - low <= spec.resolution * low * (1 + 1e-9):
            return None
        return (low + high) / 2.0


# --------------------------------------------------------------------------------------------------
# Honest uncertainty: sample counts behind a percentile, and the interval of a gain

#: A p99 from fewer samples than this is marked "low-sample": it rests on its last few values.
LOW_SAMPLE_P99 = 1000


def rank_from_top(count: int, percentile: float = 99.0) -> int:
    """Which value from the top the HDR percentile of ``count`` samples is (1 = the maximum).

    Same rank rule as :func:`percentiles_us`: with 40 samples the p99 is the maximum, with 200
    the third largest.
    """
    if count <= 0:
        return 0
    target = max(int(min(percentile, 100.0) * count / 100 + 0.5), 1)
    return count - min(target, count) + 1


def p99_sample_note(count: int | None) -> str | None:
    """A footnote for a p99 of ``count`` samples below :data:`LOW_SAMPLE_P99`; None when enough."""
    if count is None or count >= LOW_SAMPLE_P99:
        return None
    if count <= 0:
        return "p99 of no sample"
    rank = rank_from_top(count)
    which = "the maximum" if rank == 1 else f"the {_ordinal(rank)} largest latency"
    return (
        f"low-sample p99: {count} samples, so the p99 is {which} "
        f"(a p99 needs >= {LOW_SAMPLE_P99} samples to mean its name)"
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class GainSample:
    """One measurement of one side of a gain: the value and the range the truth lies in.

    Attributes:
        value: What was measured (a capacity in req/s, or a p99 in ms).
        low: Lowest value the measurement allows (a capacity: the highest passing rate).
        high: Highest value it allows (a capacity: the lowest failing rate above it; a p99: the
            worst window's p99). Equal to ``value`` when nothing bounds it.
        censored: Nothing above ``value`` was measured to fail (a capacity search that met the
            goals at every rate it offered, up to the generator's ceiling): the truth is at
            least ``value``, with no upper bound.
    """

    value: float
    low: float
    high: float
    censored: bool = False


@dataclass(frozen=True)
class GainEstimate:
    """A gain (best over baseline, > 1 = better) with its bootstrap confidence interval.

    ``ci_high`` is None when the best side is censored (its capacity is a lower bound): the
    interval is then one-sided, ``[ci_low, inf)``, and the gain reads "at least ci_low".
    ``ci_low`` is None when the baseline side is (the gain is at most ``ci_high``).
    """

    gain: float
    ci_low: float | None
    ci_high: float | None
    #: The interval excludes 1.0.
    significant: bool
    #: Validation repeats behind (best, baseline).
    repeats: tuple[int, int]
    confidence: float = 0.95

    def sentence(self) -> str:
        """The one sentence the console, summary.json and the report all print."""
        return gain_sentence(
            self.gain, (self.ci_low, self.ci_high), self.significant, self.repeats, self.confidence
        )


def gain_sentence(
    gain: float,
    ci: Sequence[float | None] | None,
    significant: bool | None,
    repeats: Sequence[int] | None,
    confidence: float = 0.95,
) -> str:
    """``gain over baseline: 1.20x, no significant difference (95% interval 0.91-1.58x ...)``;
    with a censored side, a one-sided bound: ``gain over baseline: at least 4.46x (...)``."""
    if ci is None or significant is None:
        return f"gain over baseline: {gain:.2f}x (no interval: not recorded)"
    n_best, n_base = (int(repeats[0]), int(repeats[-1])) if repeats else (1, 1)
    per_side = (
        f"{n_best} repeat{'s' if n_best != 1 else ''} per side"
        if n_best == n_base
        else f"{n_best} and {n_base} repeats"
    )
    low, high = ci[0], ci[1]
    if low is None and high is None:
        return (
            f"gain over baseline: {gain:.2f}x (no interval: both capacities are lower bounds, "
            "each config met the goals at every rate offered)"
        )
    if high is None or low is None:
        bound, word, side = (
            (low, "at least", "the best config")
            if high is None
            else (high, "at most", "the baseline")
        )
        assert bound is not None
        why = (
            f"{side} met the goals at every rate offered, so its capacity is a lower bound; "
            f"{confidence:.0%} one-sided bound, {per_side}"
        )
        if significant:
            return f"gain over baseline: {word} {bound:.2f}x ({why})"
        return (
            f"gain over baseline: {word} {bound:.2f}x, not significantly different from 1.0 ({why})"
        )
    interval = f"{confidence:.0%} interval {low:.2f}-{high:.2f}x"
    if significant:
        text = f"gain over baseline: {gain:.2f}x ({interval}, {per_side})"
    else:
        text = (
            f"gain over baseline: {gain:.2f}x, no significant difference "
            f"({interval} includes 1.0; {per_side})"
        )
    if min(n_best, n_base) < 2:
        text += (
            "; with one repeat the interval covers the measurement's resolution only, not "
            "run-to-run noise: raise budget.validate_repeats"
        )
    return text


def gain_estimate(
    best: Sequence[GainSample],
    baseline: Sequence[GainSample],
    *,
    higher_is_better: bool = True,
    seed: int = 0,
    confidence: float = 0.95,
    replicates: int = 4000,
) -> GainEstimate | None:
    """Bootstrap interval of the worst-case gain (the headline: worst best / worst baseline).

    What it covers: where each capacity lies inside its search bracket (a capacity search only
    brackets the capacity: the truth is anywhere between the highest passing and the lowest
    failing rate), and, with several repeats, their run-to-run spread. Each replicate resamples
    each side's repeats with replacement and draws every resampled value uniformly within its
    :class:`GainSample` range; the statistic is the headline's, the worst value of each side
    (lowest capacity, highest p99). The gain itself is the headline's ratio (of the passing
    rates). Coverage on planted brackets: tests/unit/test_gain_interval.py.

    A censored side (its capacity met the goals at every rate offered, so it is only a lower
    bound) has no upper end: a censored best gives a one-sided lower bound (its
    ``1 - confidence`` quantile; ``ci_high`` None), a censored baseline a one-sided upper
    bound. Seeded, so a run directory's interval is reproducible. None when a side has no
    sample or a worst value is not positive.
    """
    if not best or not baseline:
        return None

    def worst(values: np.ndarray) -> np.ndarray:
        return values.min(axis=-1) if higher_is_better else values.max(axis=-1)

    def ratio(b: np.ndarray | float, a: np.ndarray | float) -> Any:
        return np.divide(b, a) if higher_is_better else np.divide(a, b)

    best_value = worst(np.array([s.value for s in best]))
    base_value = worst(np.array([s.value for s in baseline]))
    if not (best_value > 0 and base_value > 0):
        return None
    rng = np.random.default_rng(seed)

    def replicate(side: Sequence[GainSample]) -> np.ndarray:
        low = np.array([s.low for s in side])
        high = np.array([max(s.high, s.low) for s in side])
        picks = rng.integers(0, len(side), size=(replicates, len(side)))
        draws = low[picks] + rng.random(picks.shape) * (high[picks] - low[picks])
        return worst(draws)

    best_draws, base_draws = replicate(best), replicate(baseline)
    ok = (best_draws > 0) & (base_draws > 0)
    gains = ratio(best_draws[ok], base_draws[ok]) if ok.any() else np.array([0.0])
    # Which ends are open: a censored capacity has no upper end, so neither has the gain on its
    # side (a latency objective's samples are never censored).
    open_high = higher_is_better and any(s.censored for s in best)
    open_low = higher_is_better and any(s.censored for s in baseline)
    tail = (1 - confidence) * 100 if open_high != open_low else (1 - confidence) / 2 * 100
    lo_q, hi_q = (float(x) for x in np.percentile(gains, [tail, 100 - tail]))
    gain = float(ratio(best_value, base_value))
    # The measured gain lies inside its interval (it can fall just outside when one bracket is
    # much wider than the other); rounded as printed, so text and flag agree.
    low = None if open_low else round(min(lo_q, gain), 3)
    high = None if open_high else round(max(hi_q, gain), 3)
    gain = round(gain, 3)
    return GainEstimate(
        gain=gain,
        ci_low=low,
        ci_high=high,
        # Rounded as printed, so text and flag agree.
        significant=bool((low is not None and low > 1.0) or (high is not None and high < 1.0)),
        repeats=(len(best), len(baseline)),
        confidence=confidence,
    )
