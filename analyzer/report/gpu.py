"""The GPU part of the report: utilisation, memory and power at the operating points (pure).

The figures come from what the sweep recorded
(``analyzer.rundir.measurements.TrialMeasurement.gpu_figures``: the server's
``nv_gpu_*`` series over the operating point's measurement); a run whose server published none
(a CPU-only server, as Triton on a CPU-only host) gets one line saying so, never empty charts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analyzer.errors import InputError
from analyzer.report.record import ConfigResult, GpuSide, GpuStory, TrialPoint, as_float
from analyzer.rundir.summary import ConfigEntry

#: ``missing["gpu"]``: the one line a run without GPU figures gets.
NO_GPU_METRIC = (
    "No GPU metric: the server published no nv_gpu_* series at the operating points (a "
    "CPU-only server, as Triton on a CPU-only host, or its /metrics was not read), so "
    "utilisation, memory and power are not shown."
)


def check_threshold(pct: float | None) -> None:
    """Refuse a ``--min-gpu-utilization`` outside 0..100 (InputError, exit 2)."""
    if pct is not None and not 0.0 <= pct <= 100.0:
        raise InputError(f"--min-gpu-utilization {pct:g}: give a percentage from 0 to 100")


def _values(gpus: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [v for v in (as_float(g.get(key)) for g in gpus) if v is not None]


def utilization_pct(gpus: Sequence[Mapping[str, Any]] | None) -> float | None:
    """Mean over the GPUs of each GPU's mean utilisation (None: no figure)."""
    values = _values(gpus or (), "utilization_pct_mean")
    return sum(values) / len(values) if values else None


def memory_peak_mb(gpus: Sequence[Mapping[str, Any]] | None) -> float | None:
    """The fullest GPU's peak memory, MiB (the quantity ``goals.max_gpu_memory_mb`` bounds)."""
    values = _values(gpus or (), "memory_used_peak_mb")
    return max(values) if values else None


def gpu_side(role: str, result: ConfigResult | None, entry: ConfigEntry | None) -> GpuSide | None:
    """One side of the story from its summary entry (None when it recorded no GPU)."""
    gpus = list(entry.gpus or ()) if entry is not None else []
    if result is None or not gpus:
        return None
    util = _values(gpus, "utilization_pct_mean")
    p95 = _values(gpus, "utilization_pct_p95")
    power = _values(gpus, "power_mean_w")
    limit = _values(gpus, "power_limit_w")
    total = _values(gpus, "memory_total_mb")
    rps = result.throughput_rps
    busy = sum(util)
    watts = sum(power) if len(power) == len(gpus) else None
    return GpuSide(
        role=role,
        trial_number=result.trial_number,
        label=result.label,
        throughput_rps=rps,
        gpu_count=len(gpus),
        utilization_pct_mean=busy / len(util) if util else None,
        utilization_pct_p95=max(p95) if p95 else None,
        memory_used_peak_mb=memory_peak_mb(gpus),
        memory_total_mb=max(total) if total else None,
        power_mean_w=watts,
        power_limit_w=sum(limit) if len(limit) == len(gpus) else None,
        throughput_per_gpu_pct=round(rps / busy, 3) if util and busy > 0 else None,
        throughput_per_watt=round(rps / watts, 3) if watts else None,
        gpus=tuple(dict(g) for g in gpus),
    )


def _change(name: str, base: float | None, best: float | None, unit: str, digits: int) -> str:
    if base is None or best is None:
        return ""
    return f"{name} {base:.{digits}f}{unit} (baseline) vs {best:.{digits}f}{unit} (best)"


def gpu_story(sides: Sequence[GpuSide]) -> GpuStory:
    """The sides, and sentences comparing them when both were recorded."""
    by_role = {s.role: s for s in sides}
    base, best = by_role.get("baseline"), by_role.get("best")
    sentences: list[str] = []
    if base is not None and best is not None:
        parts = [
            _change(
                "GPU utilisation", base.utilization_pct_mean, best.utilization_pct_mean, " %", 0
            ),
            _change("peak memory", base.memory_used_peak_mb, best.memory_used_peak_mb, " MiB", 0),
            _change("power", base.power_mean_w, best.power_mean_w, " W", 0),
        ]
        shown = [p for p in parts if p]
        if shown:
            sentences.append("At each config's operating point: " + "; ".join(shown) + ".")
        a, b = base.throughput_per_gpu_pct, best.throughput_per_gpu_pct
        if a and b:
            sentences.append(
                f"Throughput per GPU-percent: {b:.2f} req/s per % for the best vs {a:.2f} for the "
                f"baseline ({b / a:.2f}x): each percent of device time serves that much more."
            )
        if (
            base.memory_used_peak_mb is not None
            and best.memory_used_peak_mb is not None
            and best.memory_used_peak_mb > base.memory_used_peak_mb
        ):
            sentences.append(
                f"The best config holds {best.memory_used_peak_mb - base.memory_used_peak_mb:.0f} "
                "MiB more GPU memory; goals.max_gpu_memory_mb (--max-gpu-memory-mb) bounds it."
            )
    return GpuStory(sides=tuple(sides), sentences=tuple(sentences))


def utilization_warnings(
    trials: Sequence[TrialPoint], best: ConfigResult | None, threshold_pct: float | None
) -> list[str]:
    """``--min-gpu-utilization``: the configs below it, the best first (Model Analyzer's flag)."""
    if threshold_pct is None:
        return []
    complete = [t for t in trials if t.state == "complete"]
    if not any(t.gpu_utilization_pct is not None for t in complete):
        return [
            f"--min-gpu-utilization {threshold_pct:g} % is not checked: no GPU utilisation was "
            "recorded."
        ]
    out = []
    chosen = next((t for t in complete if best and t.number == best.trial_number), None)
    if chosen is not None and chosen.below_min_gpu_utilization:
        out.append(
            f"The best config keeps the GPU {chosen.gpu_utilization_pct:.0f} % busy at its "
            f"operating point, below --min-gpu-utilization {threshold_pct:g} %: the device has "
            "headroom this config leaves unused."
        )
    below = [t.number for t in complete if t.below_min_gpu_utilization]
    if below:
        shown = ", ".join("baseline" if n < 0 else str(n) for n in below[:8])
        more = f" and {len(below) - 8} more" if len(below) > 8 else ""
        out.append(
            f"{len(below)} config(s) ran the GPU below --min-gpu-utilization {threshold_pct:g} % "
            f"at their operating points (trials {shown}{more}): flagged in the trials table."
        )
    return out
