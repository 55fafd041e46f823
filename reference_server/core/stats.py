"""Per-model statistics (Triton's statistics extension) and Prometheus metrics.

:class:`ModelStats` counts the same events as Triton (``research/triton_spec.md`` §7, §8): per
request success/fail/queue/compute/cache durations in ns for the statistics JSON, and the same
observations in µs (integer division per observation, as Triton does) for the metrics.

:class:`TritonCollector` turns the stats of every loaded model into metric families with
Triton's names, types, help texts and labels. ``prometheus_client.generate_latest`` renames
counters to ``<name>_total``, so :func:`render_text` writes the exposition text itself.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
#: Default bucket bounds of ``nv_inference_first_response_histogram_ms``.
HISTOGRAM_BUCKETS_MS = (100, 500, 2000, 5000)
_HISTOGRAM = "nv_inference_first_response_histogram_ms"


@dataclass
class Duration:
    """A ``{"count", "ns"}`` pair."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += max(0, ns)

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class _BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(frozen=True)
class RequestTiming:
    """The timestamps (monotonic ns) of one finished request."""

    request_start_ns: int
    queue_start_ns: int
    compute_start_ns: int
    compute_input_end_ns: int
    compute_output_start_ns: int
    compute_end_ns: int
    request_end_ns: int


class ModelMetrics:
    """Prometheus counters of one model version; thread-safe.

    Unlike :class:`ModelStats`, these outlive a reload: Triton keeps a model's metric series
    (same labels) across reloads and removes them only on unload, while the statistics
    extension starts again from zero with the new model object.

    Args:
        counters: ``--metrics-config counter_latencies``. Triton quirk kept: when false, every
            per-model counter stops (not only the latency ones).
        histogram: ``--metrics-config histogram_latencies``: also keep
            ``nv_inference_first_response_histogram_ms`` (buckets 100/500/2000/5000 ms).
    """

    def __init__(self, counters: bool = True, histogram: bool = False) -> None:
        self._lock = threading.Lock()
        self.counters = counters
        self.histogram: list[int] | None = (
            [0] * (len(HISTOGRAM_BUCKETS_MS) + 1) if histogram else None
        )
        self.histogram_sum_ms = 0.0
        self.success = 0
        self.failures: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)
        self.inference_count = 0
        self.execution_count = 0
        # Durations in µs, accumulated per observation (ns // 1000) like Triton.
        self.us: dict[str, int] = dict.fromkeys(
            (
                "request",
                "queue",
                "compute_input",
                "compute_infer",
                "compute_output",
                "cache_hit",
                "cache_miss",
            ),
            0,
        )
        self.cache_hits = 0
        self.cache_misses = 0
        self.pending = 0
        self.load_duration_s = 0.0

    def pending_add(self, delta: int) -> None:
        """Move the ``nv_inference_pending_request_count`` gauge."""
        with self._lock:
            self.pending += delta

    def observe(
        self,
        *,
        success: int = 0,
        inferences: int = 0,
        executions: int = 0,
        failure: str | None = None,
        cache_hit: bool = False,
        cache_miss: bool = False,
        durations_ns: dict[str, int] | None = None,
    ) -> None:
        """Add one event's counts and durations (ns, keyed like ``us``)."""
        if not self.counters:
            return
        with self._lock:
            self.success += success
            self.inference_count += inferences
            self.execution_count += executions
            if failure is not None:
                self.failures[failure] = self.failures.get(failure, 0) + 1
            self.cache_hits += int(cache_hit)
            self.cache_misses += int(cache_miss)
            for key, ns in (durations_ns or {}).items():
                self.us[key] += max(0, ns) // 1000

    def observe_first_response(self, duration_ns: int) -> None:
        """One request's time to its first response (histogram; ms, truncated like Triton)."""
        if self.histogram is None:
            return
        ms = max(0, duration_ns) // 1_000_000
        with self._lock:
            self.histogram[bisect.bisect_left(HISTOGRAM_BUCKETS_MS, ms)] += 1
            self.histogram_sum_ms += ms

    def snapshot(self) -> dict[str, Any]:
        """All values in one consistent read."""
        with self._lock:
            return {
                "histogram": None if self.histogram is None else list(self.histogram),
                "histogram_sum_ms": self.histogram_sum_ms,
                "success": self.success,
                "failures": dict(self.failures),
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "us": dict(self.us),
                "pending": self.pending,
                "cache_hits": self.cache_hits,
                "cache_misses": self.cache_misses,
                "load_duration_s": self.load_duration_s,
            }


class ModelStats:
    """Statistics of one loaded model version (the statistics extension); thread-safe.

    Args:
        name: Model name.
        version: Version string.
        metrics: The version's metric counters (kept across reloads); new ones by default.
        wall_clock: ``time.time`` (injectable), for ``last_inference`` in ms since epoch.
    """

    def __init__(
        self,
        name: str,
        version: str,
        metrics: ModelMetrics | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.version = version
        self.metrics = metrics if metrics is not None else ModelMetrics()
        self._wall = wall_clock
        self._lock = threading.Lock()
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.cache_hit = Duration()
        self.cache_miss = Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self._batches: dict[int, _BatchStat] = {}

    # ------------------------------------------------------------------ events

    def pending_add(self, delta: int) -> None:
        """Move the ``nv_inference_pending_request_count`` gauge."""
        self.metrics.pending_add(delta)

    def record_success(self, t: RequestTiming, batch_size: int, cache_miss_ns: int = 0) -> None:
        """A request executed and answered successfully."""
        request_ns = t.request_end_ns - t.request_start_ns + cache_miss_ns
        queue_ns = t.compute_start_ns - t.queue_start_ns
        cin = t.compute_input_end_ns - t.compute_start_ns
        cinf = t.compute_output_start_ns - t.compute_input_end_ns
        cout = t.compute_end_ns - t.compute_output_start_ns
        with self._lock:
            self.success.add(request_ns)
            self.queue.add(queue_ns)
            self.compute_input.add(cin)
            self.compute_infer.add(cinf)
            self.compute_output.add(cout)
            self.inference_count += batch_size
            if cache_miss_ns:
                self.cache_miss.add(cache_miss_ns)
        durations = {
            "request": request_ns,
            "queue": queue_ns,
            "compute_input": cin,
            "compute_infer": cinf,
            "compute_output": cout,
        }
        if cache_miss_ns:
            durations["cache_miss"] = cache_miss_ns
        self.metrics.observe(
            success=1,
            inferences=batch_size,
            cache_miss=bool(cache_miss_ns),
            durations_ns=durations,
        )
        self.metrics.observe_first_response(request_ns)

    def record_cache_hit(self, request_ns: int, queue_ns: int, lookup_ns: int) -> None:
        """A request answered from the response cache (§4): no execution, no inference."""
        with self._lock:
            self.success.add(request_ns)
            self.queue.add(queue_ns)
            self.cache_hit.add(lookup_ns)
        self.metrics.observe(
            success=1,
            cache_hit=True,
            durations_ns={"request": request_ns, "queue": queue_ns, "cache_hit": lookup_ns},
        )
        self.metrics.observe_first_response(request_ns)

    def record_failure(self, reason: str, request_start_ns: int, end_ns: int) -> None:
        """An accepted request failed (timeout, cancellation, backend error)."""
        with self._lock:
            self.fail.add(end_ns - request_start_ns)
        self.metrics.observe(failure=reason)

    def record_execution(
        self, batch_size: int, compute_input_ns: int, compute_infer_ns: int, compute_output_ns: int
    ) -> None:
        """One execution of a batch of total size ``batch_size``."""
        with self._lock:
            self.execution_count += 1
            self.last_inference_ms = int(self._wall() * 1000)
            stat = self._batches.setdefault(batch_size, _BatchStat())
            stat.compute_input.add(compute_input_ns)
            stat.compute_infer.add(compute_infer_ns)
            stat.compute_output.add(compute_output_ns)
        self.metrics.observe(executions=1)

    # ------------------------------------------------------------------ views

    def batch_stats(self) -> dict[int, int]:
        """Executions per batch size (a compact view for tests and reports)."""
        with self._lock:
            return {bs: s.compute_infer.count for bs, s in sorted(self._batches.items())}

    def to_json(self) -> dict[str, Any]:
        """One entry of ``{"model_stats": [...]}`` exactly as Triton renders it."""
        with self._lock:
            return {
                "name": self.name,
                "version": self.version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {
                    "success": self.success.to_json(),
                    "fail": self.fail.to_json(),
                    "queue": self.queue.to_json(),
                    "compute_input": self.compute_input.to_json(),
                    "compute_infer": self.compute_infer.to_json(),
                    "compute_output": self.compute_output.to_json(),
                    "cache_hit": self.cache_hit.to_json(),
                    "cache_miss": self.cache_miss.to_json(),
                },
                "response_stats": {},
                "batch_stats": [
                    {
                        "batch_size": bs,
                        "compute_input": s.compute_input.to_json(),
                        "compute_infer": s.compute_infer.to_json(),
                        "compute_output": s.compute_output.to_json(),
                    }
                    for bs, s in sorted(self._batches.items())
                ],
                "memory_usage": [],
            }


@dataclass(frozen=True)
class MetricSource:
    """One loaded model version as the collector sees it."""

    name: str
    version: str
    metrics: ModelMetrics
    tags: dict[str, str]
    cache_enabled: bool = False
    #: What each instance runs on (``InstanceRuntime.device_info``): published as the
    #: ``perfsweep_model_device_info`` gauge, a reference-server addition (Triton has none), so
    #: a client can tell which device and execution provider actually ran the model.
    devices: tuple[dict[str, str], ...] = ()


# (name, type, help, key in snapshot)
_MODEL_METRICS: tuple[tuple[str, str, str], ...] = (
    (
        "nv_inference_request_success",
        "counter",
        "Number of successful inference requests, all batch sizes",
    ),
    (
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests, all batch sizes",
    ),
    (
        "nv_inference_count",
        "counter",
        "Number of inferences performed (does not include cached requests)",
    ),
    (
        "nv_inference_exec_count",
        "counter",
        "Number of model executions performed (does not include cached requests)",
    ),
    (
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    ),
    ("nv_model_load_duration_secs", "gauge", "Model load time in seconds"),
)
_CACHE_MODEL_METRICS = (
    ("nv_cache_num_hits_per_model", "counter", "Number of cache hits per model"),
    ("nv_cache_num_misses_per_model", "counter", "Number of cache misses per model"),
    (
        "nv_cache_hit_duration_per_model",
        "counter",
        "Total cache hit duration per model, in microseconds",
    ),
    (
        "nv_cache_miss_duration_per_model",
        "counter",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
    ),
)
_CACHE_GLOBAL_HELP = {
    "nv_cache_num_entries": "Number of responses stored in response cache",
    "nv_cache_num_lookups": "Number of cache lookups in response cache",
    "nv_cache_num_hits": "Number of cache hits in response cache",
    "nv_cache_num_misses": "Number of cache misses in response cache",
    "nv_cache_num_evictions": "Number of cache evictions in response cache",
    "nv_cache_util": "Cache utilization [0.0 - 1.0]",
    "nv_cache_lookup_duration": "Total cache lookup duration (hit and miss), in microseconds",
    "nv_cache_insertion_duration": "Total cache insertion duration, in microseconds",
}


#: The reference server's own metric naming the device each instance ran on.
DEVICE_INFO_METRIC = "perfsweep_model_device_info"
_DEVICE_LABELS = frozenset({"instance", "kind", "backend", "device", "provider", "profile"})


class TritonCollector(Collector):
    """Yields Triton's metric families for the models a server currently has loaded.

    Args:
        sources: Called at every scrape; returns the loaded models.
        cache_gauges: Called at every scrape; server-wide cache gauges, or None without cache.
    """

    def __init__(
        self,
        sources: Callable[[], Iterable[MetricSource]],
        cache_gauges: Callable[[], dict[str, float] | None] | None = None,
    ) -> None:
        self._sources = sources
        self._cache_gauges = cache_gauges

    def collect(self) -> Iterator[Metric]:
        families = {name: Metric(name, help_, typ) for name, typ, help_ in _MODEL_METRICS}
        cache_families = {
            name: Metric(name, help_, typ) for name, typ, help_ in _CACHE_MODEL_METRICS
        }
        any_cache = False
        histogram = Metric(
            _HISTOGRAM, "Duration from request to first response in milliseconds", "histogram"
        )
        device_info = Metric(
            DEVICE_INFO_METRIC,
            "What each model instance runs on (reference server only; value is always 1)",
            "gauge",
        )
        for src in self._sources():
            snap = src.metrics.snapshot()
            labels = {"model": src.name, "version": src.version}
            labels.update({f"_{k}": v for k, v in src.tags.items()})
            us = snap["us"]
            values = {
                "nv_inference_request_success": snap["success"],
                "nv_inference_count": snap["inference_count"],
                "nv_inference_exec_count": snap["execution_count"],
                "nv_inference_request_duration_us": us["request"],
                "nv_inference_queue_duration_us": us["queue"],
                "nv_inference_compute_input_duration_us": us["compute_input"],
                "nv_inference_compute_infer_duration_us": us["compute_infer"],
                "nv_inference_compute_output_duration_us": us["compute_output"],
                "nv_inference_pending_request_count": snap["pending"],
                "nv_model_load_duration_secs": snap["load_duration_s"],
            }
            for name, value in values.items():
                families[name].add_sample(name, labels, value)
            for reason in FAILURE_REASONS:
                families["nv_inference_request_failure"].add_sample(
                    "nv_inference_request_failure",
                    {**labels, "reason": reason},
                    snap["failures"].get(reason, 0),
                )
            if snap["histogram"] is not None:
                cumulative = 0
                bounds = [str(b) for b in HISTOGRAM_BUCKETS_MS] + ["+Inf"]
                for bound, count in zip(bounds, snap["histogram"], strict=True):
                    cumulative += count
                    histogram.add_sample(
                        f"{_HISTOGRAM}_bucket", {**labels, "le": bound}, cumulative
                    )
                histogram.add_sample(f"{_HISTOGRAM}_sum", labels, snap["histogram_sum_ms"])
                histogram.add_sample(f"{_HISTOGRAM}_count", labels, cumulative)
            for device in src.devices:
                device_info.add_sample(
                    DEVICE_INFO_METRIC,
                    {
                        "model": src.name,
                        "version": src.version,
                        **{k: v for k, v in device.items() if k in _DEVICE_LABELS},
                    },
                    1,
                )
            if src.cache_enabled:
                any_cache = True
                cache_values = {
                    "nv_cache_num_hits_per_model": snap["cache_hits"],
                    "nv_cache_num_misses_per_model": snap["cache_misses"],
                    "nv_cache_hit_duration_per_model": us["cache_hit"],
                    "nv_cache_miss_duration_per_model": us["cache_miss"],
                }
                for name, value in cache_values.items():
                    cache_families[name].add_sample(name, labels, value)
        yield from families.values()
        if histogram.samples:
            yield histogram
        if device_info.samples:
            yield device_info
        if any_cache:
            yield from cache_families.values()
        gauges = self._cache_gauges() if self._cache_gauges else None
        if gauges is not None:
            for name, value in gauges.items():
                metric = Metric(name, _CACHE_GLOBAL_HELP.get(name, name), "gauge")
                metric.add_sample(name, {}, value)
                yield metric


def _format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int) or (math.isfinite(value) and float(value).is_integer()):
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render_text(registry: CollectorRegistry) -> str:
    """Prometheus text exposition the way Triton (prometheus-cpp) writes it.

    Counters keep their names (no ``_total``), labels are sorted, integral values have no
    decimals. Families without samples are still announced (HELP/TYPE), like Triton's
    pre-created families.
    """
    lines: list[str] = []
    for metric in registry.collect():
        mtype = "untyped" if metric.type == "unknown" else metric.type
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines.append(f"# HELP {metric.name} {doc}")
        lines.append(f"# TYPE {metric.name} {mtype}")
        for sample in metric.samples:
            if sample.labels:
                # Sorted like Triton's labels, but "le" last as Prometheus clients expect.
                ordered = sorted(sample.labels.items(), key=lambda kv: (kv[0] == "le", kv[0]))
                body = ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in ordered)
                lines.append(f"{sample.name}{{{body}}} {_format_value(sample.value)}")
            else:
                lines.append(f"{sample.name} {_format_value(sample.value)}")
    return "\n".join(lines) + "\n" if lines else ""
