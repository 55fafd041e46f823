"""Planted GPU figures for the fake load generator: memory and utilisation are formulas.

Memory at a level = ``CONTEXT_MB`` + ``WEIGHTS_MB`` per instance + ``ACTIVATION_MB`` per item of
the batch the config forms (one instance's arena at its peak); utilisation = the device time the
planted model spends per second at that rate (capped at 100 %); power = idle + busy share.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from analyzer.config.knobs import Knobs
from analyzer.measure.measurement import GpuStats, Measurement, ServerView
from tests.sweep.planted import FakeLoadGenerator, PlantedModel

CONTEXT_MB = 300.0
WEIGHTS_MB = 400.0
ACTIVATION_MB = 2.0
TOTAL_MB = 16384.0
UUID = "GPU-00000000-0000-0000-0000-000000000001"


def planted_memory_mb(knobs: Knobs, batch: float) -> float:
    """The memory the planted GPU holds for ``knobs`` forming batches of ``batch``."""
    return CONTEXT_MB + WEIGHTS_MB * knobs.instance_count + ACTIVATION_MB * batch


def planted_gpu(model: PlantedModel, knobs: Knobs, rate: float) -> GpuStats:
    batch = model.batch_size(knobs, rate)
    busy = min(100.0, 100.0 * rate / 1000.0 * model.device_ms(batch, knobs.instance_count) / batch)
    return GpuStats(
        uuid=UUID,
        name="planted GPU",
        utilization_pct_mean=round(busy, 3),
        utilization_pct_p95=round(min(100.0, busy * 1.05), 3),
        utilization_samples_pct=(round(busy, 3),),
        memory_used_peak_mb=planted_memory_mb(knobs, batch),
        memory_total_mb=TOTAL_MB,
        power_mean_w=round(20.0 + 0.5 * busy, 3),
        power_limit_w=70.0,
    )


@dataclass
class GpuLoadGenerator(FakeLoadGenerator):
    """The planted fake with a planted GPU in every measurement's server view."""

    def _measurement(self, rate: float, knobs: Knobs, p99: float) -> Measurement:
        m = super()._measurement(rate, knobs, p99)
        server = m.server or ServerView()
        return replace(m, server=replace(server, gpus=(planted_gpu(self.model, knobs, rate),)))
