"""The report's trial points, the Pareto front and each config's result, with cache hit ratios.

A throughput measured while the response cache answered requests is not the model's: every
label shown beside such a figure ends in its hit ratio (:func:`with_hits`), and the verdict
warns once (:func:`cache_warning`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from analyzer.config.objective import Objective
from analyzer.measure.measurement import Measurement
from analyzer.report.gpu import memory_peak_mb, utilization_pct
from analyzer.report.record import ConfigResult, TrialPoint, as_float
from analyzer.rundir.summary import ConfigEntry, RunSummary
from analyzer.rundir.trial_record import TrialRecord
from analyzer.target.server_stats import cache_hit_ratio, cache_hits_text


def hit_ratio(measurement: Measurement | None) -> float | None:
    """The response cache's hits / lookups over a measurement; None: no cache lookups seen."""
    return cache_hit_ratio(measurement.server) if measurement is not None else None


def with_hits(label: str, ratio: float | None) -> str:
    """``label`` followed by its cache hit ratio when the measurement had cache lookups."""
    return f"{label} · {cache_hits_text(ratio)}" if ratio is not None else label


def _record_ratio(record: TrialRecord | None) -> float | None:
    return hit_ratio(record.operating_point()) if record is not None else None


def cache_warning(records: Sequence[TrialRecord]) -> str | None:
    """The verdict's warning when some config was measured with response-cache hits."""
    ratios = [r for r in (_record_ratio(x) for x in records if x.complete) if r is not None]
    if not ratios or max(ratios) == 0:
        return None
    low, high = cache_hits_text(min(ratios)), cache_hits_text(max(ratios))
    span = high if low == high else f"{low.split(' %')[0]}-{high}"
    return (
        f"Throughputs include response-cache hits ({span}): a hit is answered without running "
        "the model, so a figure holds only for traffic that repeats as this run's did; each "
        "config's label gives its hit ratio."
    )


def objective_value(objective: Objective, point: TrialPoint) -> float | None:
    """The value the search optimised for a trial (:attr:`Objective.metric`), None if incomplete."""
    if point.state != "complete":
        return None
    return objective.value(point)


def _trial_point(
    record: TrialRecord, front: set[int], min_gpu_utilization_pct: float | None = None
) -> TrialPoint:
    op = record.operating_point()
    complete = record.complete
    measured = record.measurement if complete else None
    gpus = measured.gpu_figures() if measured is not None else None
    util = utilization_pct(gpus)
    values = record.values
    return TrialPoint(
        number=record.number,
        source=record.source,
        state=record.state,
        config=record.config.to_dict(),
        label=with_hits(record.config.label(), hit_ratio(op) if complete else None),
        throughput_rps=as_float(record.throughput_rps) if complete else None,
        offered_rps=as_float(record.offered_rps) if complete else None,
        p50_ms=as_float(record.p50_ms) if complete else None,
        p90_ms=as_float(record.p90_ms) if complete else None,
        p99_ms=as_float(record.p99_ms) if complete else None,
        error_rate=as_float(record.error_rate) if complete else None,
        # The one rule (analyzer.measure.goals.goals_met): an unusable measurement never meets them,
        # whatever an older record says.
        meets_goals=record.feasible,
        failure=record.failure,
        duration_s=as_float(record.duration_s),
        stable=op.stable if op is not None else None,
        valid=op.valid if op is not None else None,
        on_front=record.number in front,
        reference_p99_ms=as_float(values[1]) if complete and len(values) > 1 else None,
        p99_n=measured.request_count() if measured is not None else None,
        gpu_utilization_pct=round(util, 2) if util is not None else None,
        gpu_memory_peak_mb=memory_peak_mb(gpus),
        below_min_gpu_utilization=(
            util < min_gpu_utilization_pct
            if util is not None and min_gpu_utilization_pct is not None
            else None
        ),
    )


def _front_numbers(
    summary: RunSummary, records: Sequence[TrialRecord], objective: Objective
) -> set[int]:
    """Trials on the throughput/p99 Pareto front (the study's own front when the objective's
    answer is a front)."""
    if objective.multi and summary.pareto:
        return {p.trial_number for p in summary.pareto}
    feasible = [
        (r.number, r.throughput_rps, r.p99_ms)
        for r in records
        if r.complete and r.meets_goals and r.number >= 0
    ]
    return pareto_front(feasible)


def pareto_front(points: Sequence[tuple[int, float, float]]) -> set[int]:
    """Numbers of the non-dominated points of (number, throughput to maximise, p99 to minimise)."""
    front = set()
    for number, rps, p99 in points:
        dominated = any(
            (o_rps >= rps and o_p99 <= p99) and (o_rps > rps or o_p99 < p99)
            for _, o_rps, o_p99 in points
        )
        if not dominated:
            front.add(number)
    return front


def _config_result(
    role: str,
    entry: ConfigEntry | None,
    trials: Mapping[int, TrialPoint],
    records: Mapping[int, TrialRecord],
) -> ConfigResult | None:
    if entry is None:
        return None
    point = trials.get(entry.trial_number)
    return ConfigResult(
        role=role,
        trial_number=entry.trial_number,
        config=entry.config.to_dict(),
        label=with_hits(entry.config.label(), _record_ratio(records.get(entry.trial_number))),
        throughput_rps=entry.throughput_rps,
        p50_ms=entry.p50_ms,
        p99_ms=entry.p99_ms,
        meets_goals=entry.meets_goals,
        validated_throughput_rps=as_float(entry.validated_throughput_rps),
        offered_rps=point.offered_rps if point is not None else None,
        p99_n=entry.p99_n,
        p99_note=entry.p99_note,
    )
