"""The server's own view of a window: scrape statistics and metrics, turn two snapshots into deltas.

Sources (both optional, both Triton's):

* the statistics extension, ``GET /v2/models/<m>/stats`` (cumulative counts and nanoseconds per
  model version, plus ``batch_stats``: executions per batch size);
* Prometheus ``/metrics`` (failures by reason, the pending-request gauge used to wait for a drain,
  the response cache's ``nv_cache_num_hits_per_model`` / ``nv_cache_num_misses_per_model``, and
  Triton's GPU series ``nv_gpu_*`` / ``nv_energy_consumption`` per ``gpu_uuid``). One parser
  reads a real Triton's page and the reference server's.

Response cache: a window's hits and misses are the deltas of the statistics' ``cache_hit.count``
and ``cache_miss.count`` (else of the per-model cache counters); :func:`cache_window` computes
them and :func:`cache_hit_ratio` reads the ratio back from a ``ServerView``. A cache hit is a
success that never ran the model, so a throughput with hits is not the model's throughput: every
figure measured with hits is shown with its ratio (``analyzer.report``).

HTTP goes through the transport seam (:mod:`analyzer.target.transport`, urllib by default): this
module must work in a normal process and in a gevent-patched one (where urllib's sockets are
cooperative), and its scrapes are tested with a ``MockTransport``. ``server_view(before, after)``
is pure and unit-tested.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from analyzer.measure.measurement import GpuStats, ServerView, utilization_summary
from analyzer.target.transport import Request, Transport, UrllibTransport

#: A generative engine's preemptions counter (vLLM's name; the reference engine's too).
PREEMPTIONS_METRIC = "vllm:num_preemptions"

#: The four ``reason`` label values of ``nv_inference_request_failure``.
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

_DURATION_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")

#: Triton's GPU families (gauges, and the energy counter) -> GpuSample field.
GPU_FAMILIES = {
    "nv_gpu_utilization": "utilization",
    "nv_gpu_memory_total_bytes": "memory_total_bytes",
    "nv_gpu_memory_used_bytes": "memory_used_bytes",
    "nv_gpu_power_usage": "power_w",
    "nv_gpu_power_limit": "power_limit_w",
    "nv_energy_consumption": "energy_j",
}
#: The reference server's name for each GPU (Triton's page has only the uuid).
GPU_INFO_METRIC = "perfsweep_gpu_info"
_MB = 1024.0 * 1024.0
#: Per-model cache counters (Triton prints them only for a model with the cache enabled).
CACHE_HIT_METRIC = "nv_cache_num_hits_per_model"
CACHE_MISS_METRIC = "nv_cache_num_misses_per_model"


@dataclass(frozen=True)
class StatsSnapshot:
    """Cumulative model statistics at one instant, summed over the model's versions."""

    inference_count: int = 0
    execution_count: int = 0
    #: key -> (count, ns) for success, fail, queue, compute_input, compute_infer, compute_output.
    durations: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: batch size -> executions.
    batch_executions: dict[int, int] = field(default_factory=dict)
    #: compute_infer ns summed over ``batch_stats`` (once per execution).
    batch_compute_infer_ns: int = 0
    #: ``inference_stats.cache_hit.count`` / ``cache_miss.count`` (0 without a cache).
    cache_hits: int = 0
    cache_misses: int = 0
    #: A pipeline's composing models' own statistics at the same instant, by name.
    stages: dict[str, StatsSnapshot] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuSample:
    """One GPU's series at one instant (a series the server does not print is None)."""

    uuid: str
    name: str | None = None
    utilization: float | None = None
    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None


@dataclass(frozen=True)
class MetricsSnapshot:
    """The per-model Prometheus series perfsweep uses, and the server's GPUs."""

    failures_by_reason: dict[str, int] = field(default_factory=dict)
    pending_requests: int | None = None
    #: gpu_uuid -> its series; empty when the server printed no GPU family (CPU-only).
    gpus: dict[str, GpuSample] = field(default_factory=dict)
    #: ``nv_cache_num_hits_per_model`` / ``..._misses_...``; None when the page has neither
    #: (the model does not enable the cache, or the server has none).
    cache_hits: int | None = None
    cache_misses: int | None = None
    #: A generative engine's ``vllm:num_preemptions_total`` (label ``model_name``); None when
    #: the page has no such counter (a model Triton's batchers schedule).
    preemptions: int | None = None


@dataclass(frozen=True)
class CacheWindow:
    """The response cache over one window: lookups that hit and that missed."""

    hits: int
    misses: int

    @property
    def lookups(self) -> int:
        """Requests the cache was asked about."""
        return self.hits + self.misses

    @property
    def hit_ratio(self) -> float | None:
        """Hits / lookups; None when nothing was looked up."""
        return self.hits / self.lookups if self.lookups else None


@dataclass(frozen=True)
class ServerSnapshot:
    """Both sources at one instant; a source that could not be read is None."""

    stats: StatsSnapshot | None
    metrics: MetricsSnapshot | None
    #: ``time.monotonic()`` when taken (the span that turns energy into mean power); not
    #: part of equality: two snapshots with the same content are the same reading.
    taken_at: float | None = field(default=None, compare=False)


def parse_model_stats(doc: Mapping[str, Any], model: str) -> StatsSnapshot:
    """Sum a statistics-extension document over the versions of ``model``.

    Accepts both the HTTP JSON and tritonclient.grpc's ``as_json`` rendering (where 64-bit counts
    are strings).
    """
    inference = execution = 0
    durations: dict[str, list[int]] = {k: [0, 0] for k in _DURATION_KEYS}
    batches: dict[int, int] = {}
    batch_infer_ns = 0
    cache_hits = cache_misses = 0
    for entry in doc.get("model_stats", []):
        if entry.get("name") != model:
            continue
        inference += int(entry.get("inference_count", 0))
        execution += int(entry.get("execution_count", 0))
        inference_stats = entry.get("inference_stats", {})
        for key in _DURATION_KEYS:
            d = inference_stats.get(key, {})
            durations[key][0] += int(d.get("count", 0))
            durations[key][1] += int(d.get("ns", 0))
        cache_hits += int(inference_stats.get("cache_hit", {}).get("count", 0))
        cache_misses += int(inference_stats.get("cache_miss", {}).get("count", 0))
        for b in entry.get("batch_stats", []):
            size = int(b.get("batch_size", 0))
            count = int(b.get("compute_infer", {}).get("count", 0))
            batches[size] = batches.get(size, 0) + count
            batch_infer_ns += int(b.get("compute_infer", {}).get("ns", 0))
    return StatsSnapshot(
        inference_count=inference,
        execution_count=execution,
        durations={k: (v[0], v[1]) for k, v in durations.items()},
        batch_executions=batches,
        batch_compute_infer_ns=batch_infer_ns,
        cache_hits=cache_hits,
        cache_misses=cache_misses,
    )


def parse_metrics(text: str, model: str) -> MetricsSnapshot:
    """Pick ``model``'s failure counters and pending gauge out of Prometheus text (all versions),
    and every GPU's series (``nv_gpu_*``, ``nv_energy_consumption``, ``perfsweep_gpu_info``)."""
    failures: dict[str, int] = {}
    pending: int | None = None
    cache: dict[str, int] = {}
    gpus: dict[str, dict[str, Any]] = {}
    preemptions: int | None = None
    for family in text_string_to_metric_families(text):
        if family.name.removesuffix("_total") == PREEMPTIONS_METRIC:
            # The parser files a counter's samples under a family of its own when its name
            # has a colon (vLLM's do): match the samples by name.
            for sample in family.samples:
                named = sample.name == f"{PREEMPTIONS_METRIC}_total"
                if named and sample.labels.get("model_name") == model:
                    preemptions = (preemptions or 0) + int(sample.value)
            continue
        # The parser names a counter's family without ``_total`` and its samples with it.
        gpu_field = GPU_FAMILIES.get(family.name)
        if gpu_field is not None or family.name == GPU_INFO_METRIC:
            for sample in family.samples:
                uid = sample.labels.get("gpu_uuid")
                if not uid:
                    continue
                entry = gpus.setdefault(uid, {"uuid": uid})
                if gpu_field is not None:
                    entry[gpu_field] = float(sample.value)
                else:
                    entry["name"] = sample.labels.get("name") or None
            continue
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name in (
                "nv_inference_request_failure",
                "nv_inference_request_failure_total",
            ):
                reason = sample.labels.get("reason", "OTHER")
                failures[reason] = failures.get(reason, 0) + int(sample.value)
            elif sample.name == "nv_inference_pending_request_count":
                pending = (pending or 0) + int(sample.value)
            elif sample.name.removesuffix("_total") in (CACHE_HIT_METRIC, CACHE_MISS_METRIC):
                name = sample.name.removesuffix("_total")
                cache[name] = cache.get(name, 0) + int(sample.value)
    has_cache = bool(cache)
    return MetricsSnapshot(
        failures_by_reason=failures,
        pending_requests=pending,
        gpus={uid: GpuSample(**entry) for uid, entry in sorted(gpus.items())},
        cache_hits=cache.get(CACHE_HIT_METRIC, 0) if has_cache else None,
        cache_misses=cache.get(CACHE_MISS_METRIC, 0) if has_cache else None,
        preemptions=preemptions,
    )


def cache_window(before: ServerSnapshot, after: ServerSnapshot) -> CacheWindow | None:
    """The cache's hits and misses between two snapshots; None when the window looked nothing
    up (no cache, or no source readable at both ends).

    The statistics' ``cache_hit``/``cache_miss`` counts come first (the same document as every
    other count of the window); the per-model cache counters are the fallback.
    """
    window: CacheWindow | None = None
    if before.stats is not None and after.stats is not None:
        window = CacheWindow(
            hits=after.stats.cache_hits - before.stats.cache_hits,
            misses=after.stats.cache_misses - before.stats.cache_misses,
        )
    elif (
        before.metrics is not None
        and after.metrics is not None
        and after.metrics.cache_hits is not None
        and after.metrics.cache_misses is not None
    ):
        window = CacheWindow(
            hits=after.metrics.cache_hits - (before.metrics.cache_hits or 0),
            misses=after.metrics.cache_misses - (before.metrics.cache_misses or 0),
        )
    return window if window is not None and window.lookups > 0 else None


def cache_hit_ratio(view: ServerView | None) -> float | None:
    """A view's cache hits / lookups; None without a view or without lookups (no cache)."""
    if view is None:
        return None
    hits = view.cache_hit_count
    lookups = hits + view.cache_miss_count
    return hits / lookups if lookups else None


def cache_hits_text(ratio: float | None) -> str:
    """``90 % cache hits`` (what follows a throughput measured with the cache); "" for None."""
    if ratio is None:
        return ""
    pct = 100.0 * ratio
    shown = "<1" if 0 < pct < 0.5 else ">99" if 99.5 <= pct < 100 else f"{pct:.0f}"
    return f"{shown} % cache hits"


def gpu_window(before: GpuSample | None, after: GpuSample, span_s: float | None) -> GpuStats:
    """One GPU over one window: the utilisation gauge at its end (it covers the server's
    metrics interval), the larger memory reading, power from the energy counter's increase
    over ``span_s`` (else the mean of the power gauge readings)."""
    util = [100.0 * after.utilization] if after.utilization is not None else []
    memory = [
        s.memory_used_bytes / _MB
        for s in (before, after)
        if s is not None and s.memory_used_bytes is not None
    ]
    power: float | None = None
    if (
        before is not None
        and before.energy_j is not None
        and after.energy_j is not None
        and span_s
        and span_s > 0
        and after.energy_j >= before.energy_j
    ):
        power = (after.energy_j - before.energy_j) / span_s
    else:
        gauges = [s.power_w for s in (before, after) if s is not None and s.power_w is not None]
        power = sum(gauges) / len(gauges) if gauges else None
    mean, p95 = utilization_summary(util)
    return GpuStats(
        uuid=after.uuid,
        name=after.name,
        utilization_pct_mean=mean,
        utilization_pct_p95=p95,
        utilization_samples_pct=tuple(util),
        memory_used_peak_mb=max(memory) if memory else None,
        memory_total_mb=after.memory_total_bytes / _MB
        if after.memory_total_bytes is not None
        else None,
        power_mean_w=power,
        power_limit_w=after.power_limit_w,
    )


def combine_gpus(per_window: list[tuple[GpuStats, ...]]) -> tuple[GpuStats, ...]:
    """Per GPU over several windows: samples pooled (mean, p95), peak memory, mean power."""
    by_uuid: dict[str, list[GpuStats]] = {}
    for window in per_window:
        for g in window:
            by_uuid.setdefault(g.uuid, []).append(g)
    out = []
    for uid, stats in by_uuid.items():
        samples = tuple(x for g in stats for x in g.utilization_samples_pct)
        mean, p95 = utilization_summary(samples)
        memory = [g.memory_used_peak_mb for g in stats if g.memory_used_peak_mb is not None]
        power = [g.power_mean_w for g in stats if g.power_mean_w is not None]
        last = stats[-1]
        out.append(
            GpuStats(
                uuid=uid,
                name=last.name,
                utilization_pct_mean=mean,
                utilization_pct_p95=p95,
                utilization_samples_pct=samples,
                memory_used_peak_mb=max(memory) if memory else None,
                memory_total_mb=last.memory_total_mb,
                power_mean_w=sum(power) / len(power) if power else None,
                power_limit_w=last.power_limit_w,
            )
        )
    return tuple(out)


def server_view(before: ServerSnapshot, after: ServerSnapshot) -> ServerView | None:
    """What happened on the server between two snapshots; None when no source was readable."""
    if after.stats is None and after.metrics is None:
        return None
    kwargs: dict[str, Any] = {}
    cache = cache_window(before, after)
    if cache is not None:
        kwargs.update(cache_hit_count=cache.hits, cache_miss_count=cache.misses)
    if before.stats is not None and after.stats is not None:
        b, a = before.stats, after.stats
        stages = {
            name: server_view(ServerSnapshot(b.stages.get(name), None), ServerSnapshot(s, None))
            for name, s in a.stages.items()
        }
        if stages:
            kwargs["stages"] = {name: v for name, v in stages.items() if v is not None}

        def delta(key: str) -> tuple[int, int]:
            cb, nb = b.durations.get(key, (0, 0))
            ca, na = a.durations.get(key, (0, 0))
            return ca - cb, na - nb

        success, _ = delta("success")
        executions = a.execution_count - b.execution_count
        inferences = a.inference_count - b.inference_count

        def per_request_us(key: str) -> float:
            count, ns = delta(key)
            return ns / count / 1000.0 if count > 0 else 0.0

        batch_sizes = {
            size: n - b.batch_executions.get(size, 0)
            for size, n in a.batch_executions.items()
            if n - b.batch_executions.get(size, 0) > 0
        }
        kwargs.update(
            success_count=success,
            failure_count=delta("fail")[0],
            inference_count=inferences,
            execution_count=executions,
            avg_batch_size=inferences / executions if executions > 0 else 0.0,
            queue_us=per_request_us("queue"),
            compute_input_us=per_request_us("compute_input"),
            compute_infer_us=per_request_us("compute_infer"),
            compute_output_us=per_request_us("compute_output"),
            batch_sizes=batch_sizes,
            execution_compute_infer_us=(a.batch_compute_infer_ns - b.batch_compute_infer_ns)
            / 1000.0,
        )
    if after.metrics is not None:
        kwargs["pending_requests"] = after.metrics.pending_requests
        span = (
            after.taken_at - before.taken_at
            if after.taken_at is not None and before.taken_at is not None
            else None
        )
        prior = before.metrics.gpus if before.metrics is not None else {}
        kwargs["gpus"] = tuple(
            gpu_window(prior.get(uid), sample, span) for uid, sample in after.metrics.gpus.items()
        )
        if before.metrics is not None:
            fb, fa = before.metrics.failures_by_reason, after.metrics.failures_by_reason
            kwargs["failures_by_reason"] = {r: fa[r] - fb.get(r, 0) for r in sorted(fa)}
            if "failure_count" not in kwargs:
                kwargs["failure_count"] = sum(kwargs["failures_by_reason"].values())
            pb, pa = before.metrics.preemptions, after.metrics.preemptions
            if pb is not None and pa is not None:
                kwargs["preemptions"] = pa - pb
    return ServerView(**kwargs)


def combine_views(views: list[ServerView | None]) -> ServerView | None:
    """Combine per-window views into one: counts add, per-request times are re-weighted by
    successes, the pending gauge is the last one. None when no window had a view."""
    present = [v for v in views if v is not None]
    if not present:
        return None
    success = sum(v.success_count for v in present)
    executions = sum(v.execution_count for v in present)
    inferences = sum(v.inference_count for v in present)

    def weighted(attr: str) -> float:
        return (
            sum(getattr(v, attr) * v.success_count for v in present) / success if success else 0.0
        )

    batch_sizes: dict[int, int] = {}
    failures: dict[str, int] = {}
    for v in present:
        for size, n in v.batch_sizes.items():
            batch_sizes[size] = batch_sizes.get(size, 0) + n
        for reason, n in v.failures_by_reason.items():
            failures[reason] = failures.get(reason, 0) + n
    return ServerView(
        cache_hit_count=sum(v.cache_hit_count for v in present),
        cache_miss_count=sum(v.cache_miss_count for v in present),
        success_count=success,
        failure_count=sum(v.failure_count for v in present),
        failures_by_reason=failures,
        inference_count=inferences,
        execution_count=executions,
        avg_batch_size=inferences / executions if executions else 0.0,
        queue_us=weighted("queue_us"),
        compute_input_us=weighted("compute_input_us"),
        compute_infer_us=weighted("compute_infer_us"),
        compute_output_us=weighted("compute_output_us"),
        batch_sizes=batch_sizes,
        execution_compute_infer_us=sum(v.execution_compute_infer_us for v in present),
        preemptions=(
            None
            if all(v.preemptions is None for v in present)
            else sum(v.preemptions or 0 for v in present)
        ),
        pending_requests=present[-1].pending_requests,
        gpus=combine_gpus([v.gpus for v in present]),
        stages={
            name: view
            for name in present[-1].stages
            if (view := combine_views([v.stages.get(name) for v in present])) is not None
        },
    )


#: The reference server's series of what each model instance runs on (a real Triton has none).
DEVICE_INFO_METRIC = "perfsweep_model_device_info"


def parse_device_info(metrics_text: str, model: str) -> list[dict[str, str]]:
    """The ``perfsweep_model_device_info`` series of ``model`` as label dicts (one per instance).

    Empty when the page has none, or cannot be parsed (a device report is optional).
    """
    found: list[dict[str, str]] = []
    try:
        for family in text_string_to_metric_families(metrics_text):
            if family.name != DEVICE_INFO_METRIC:
                continue
            found += [dict(s.labels) for s in family.samples if s.labels.get("model") == model]
    except ValueError:
        return []
    return found


def _http_get(url: str, timeout_s: float, transport: Transport | None = None) -> bytes:
    """The body of a 2xx answer to ``GET url``.

    Raises:
        OSError: No answer, or another status (``HTTPStatusError``).
    """
    answer = (transport or UrllibTransport()).request(Request("GET", url, None, timeout_s))
    return answer.raise_for_status(url).content


def http_stats_source(
    http_url: str, model: str, timeout_s: float = 5.0, transport: Transport | None = None
) -> Callable[[], dict]:
    """A callable fetching ``/v2/models/<model>/stats`` over HTTP (``http_url``: host:port);
    every model's, ``/v2/models/stats``, for ``model`` "" (a pipeline and its stages at once).

    ``transport``: the HTTP seam (default: urllib).
    """
    base = (http_url if "://" in http_url else f"http://{http_url}").rstrip("/")
    url = f"{base}/v2/models/{model}/stats" if model else f"{base}/v2/models/stats"

    def fetch() -> dict:
        doc: dict = json.loads(_http_get(url, timeout_s, transport))
        return doc

    return fetch


class ServerScraper:
    """Takes ``ServerSnapshot``s of one model; unreadable sources degrade to None, never raise.

    Args:
        model: model name.
        stats_source: returns the statistics document (see ``http_stats_source``); None to skip.
        metrics_url: full URL of the Prometheus endpoint; None to skip.
        timeout_s: per-request timeout.
        metrics_optional: ``metrics_url`` is a guess; if it fails once, stop trying, silently.
        transport: The HTTP seam of the metrics scrape (default: urllib).
        stages: A pipeline's composing models, read from the same document (the source must
            return every model's statistics then).
    """

    def __init__(
        self,
        model: str,
        stats_source: Callable[[], dict] | None,
        metrics_url: str | None,
        timeout_s: float = 5.0,
        metrics_optional: bool = False,
        transport: Transport | None = None,
        stages: tuple[str, ...] = (),
    ) -> None:
        self.model = model
        self.stages = stages
        self.transport = transport
        self.metrics_optional = metrics_optional
        self.stats_source = stats_source
        self.metrics_url = metrics_url
        self.timeout_s = timeout_s
        #: Last error per source, for the result's messages.
        self.errors: dict[str, str] = {}

    def close(self) -> None:
        """Release the statistics source's connection, if it has one."""
        close = getattr(self.stats_source, "close", None)
        if close is not None:
            close()

    def snapshot(self) -> ServerSnapshot:
        """Read both sources now."""
        return ServerSnapshot(
            stats=self._stats(), metrics=self._metrics(), taken_at=time.monotonic()
        )

    def _stats(self) -> StatsSnapshot | None:
        if self.stats_source is None:
            return None
        try:
            doc = self.stats_source()
            own = parse_model_stats(doc, self.model)
            if not self.stages:
                return own
            return replace(own, stages={s: parse_model_stats(doc, s) for s in self.stages})
        except Exception as exc:  # any failure just means "no server view" for this window
            self.errors["stats"] = f"{type(exc).__name__}: {exc}"
            return None

    def _metrics(self) -> MetricsSnapshot | None:
        if self.metrics_url is None:
            return None
        try:
            text = _http_get(self.metrics_url, self.timeout_s, self.transport)
            return parse_metrics(text.decode("utf-8", "replace"), self.model)
        except (OSError, ValueError) as exc:  # no answer, a non-2xx one, or an unreadable page
            if self.metrics_optional:
                self.metrics_url = None
            else:
                self.errors["metrics"] = f"{type(exc).__name__}: {exc}"
            return None

    def wait_drained(
        self,
        timeout_s: float,
        poll_s: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> bool:
        """Wait until the server has no request pending; True when it drained in time.

        Uses the pending-request gauge when metrics are available; otherwise waits until the
        statistics stop changing for two consecutive polls (nothing is completing any more).
        """
        deadline = clock() + timeout_s
        last: StatsSnapshot | None = None
        quiet_polls = 0
        while clock() < deadline:
            metrics = self._metrics()
            if metrics is not None and metrics.pending_requests is not None:
                if metrics.pending_requests <= 0:
                    return True
            else:
                stats = self._stats()
                if stats is None:
                    return True  # nothing to observe: the caller's own in-flight wait must do
                quiet_polls = quiet_polls + 1 if stats == last else 0
                if quiet_polls >= 2:
                    return True
                last = stats
            sleep(poll_s)
        return False
