"""vLLM's metrics for the generative engines a server runs, under vLLM's own names.

Each instance of a generative model (:mod:`reference_server.backends.generative`) is one vLLM
engine; its figures are published with vLLM's labels ``model_name`` and ``engine`` (the
instance's index): ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` (a fraction: 1 means 100 %), the counters
``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``
and ``vllm:request_success_total`` (label ``finished_reason``), and the engine's size,
``vllm:num_kv_cache_blocks_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

if TYPE_CHECKING:
    from reference_server.backends.generative import EngineStats


@dataclass(frozen=True)
class EngineSource:
    """One engine: its model, its index among the model's instances, its figures, its blocks."""

    model_name: str
    engine: int
    stats: EngineStats
    num_blocks: int


class EngineCollector:
    """A ``prometheus_client`` collector over the engines ``sources`` returns at each scrape."""

    def __init__(self, sources: Callable[[], list[EngineSource]]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        sources = self._sources()
        if not sources:
            return
        labels = ["engine", "model_name"]
        gauges = [
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                lambda s: s.stats.running,
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                lambda s: s.stats.waiting,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                lambda s: s.stats.kv_cache_usage,
            ),
            (
                "vllm:num_kv_cache_blocks_total",
                "KV-cache blocks of the engine.",
                lambda s: s.num_blocks,
            ),
        ]
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            for s in sources:
                gauge.add_metric([str(s.engine), s.model_name], float(value(s)))
            yield gauge
        counters = [
            (
                "vllm:num_preemptions",
                "Cumulative number of preemption from the engine.",
                lambda s: s.stats.preemptions,
            ),
            (
                "vllm:prompt_tokens",
                "Number of prefill tokens processed.",
                lambda s: s.stats.prompt_tokens,
            ),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                lambda s: s.stats.generation_tokens,
            ),
        ]
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=labels)
            for s in sources:
                counter.add_metric([str(s.engine), s.model_name], float(value(s)))
            yield counter
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*labels, "finished_reason"],
        )
        for s in sources:
            for reason in ("length", "stop"):
                success.add_metric(
                    [str(s.engine), s.model_name, reason], float(s.stats.finished.get(reason, 0))
                )
        yield success
