"""The report's curves over load and time: the server's breakdown of the best and baseline
configs, their load curves, the per-window time series and the search's progress.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from analyzer.config.objective import Objective
from analyzer.config.pipeline import JointKnobs
from analyzer.measure.goals import meets_goals
from analyzer.measure.measurement import Measurement, ServerView
from analyzer.measure.specs import Goals
from analyzer.report.points import hit_ratio, objective_value, with_hits
from analyzer.report.record import (
    KNOBS,
    ConfigResult,
    CurvePoint,
    LoadCurve,
    Progress,
    ProgressPoint,
    ServerBreakdown,
    SlicePoint,
    StageBreakdown,
    TimeSeries,
    TrialPoint,
    WindowPoint,
    as_float,
    knob_of_param,
)
from analyzer.report.rundir import RunData
from analyzer.rundir.trial_record import TrialRecord


def _server_breakdown(
    role: str, record: TrialRecord | None, goals: Goals | None = None
) -> ServerBreakdown | None:
    if record is None:
        return None
    op = record.operating_point()
    server = op.server if op is not None else None
    if op is None or server is None or not server.execution_count:
        return None
    duration_s = op.duration_s
    instances = record.config.instance_count or 1
    stages = stage_breakdown(record, server, duration_s)
    # A pipeline's own instances are not its stages' (an ensemble has none): busy per stage.
    busy = (
        None if isinstance(record.config, JointKnobs) else _busy_pct(server, duration_s, instances)
    )
    return ServerBreakdown(
        stages=stages,
        limiting_stage=limiting_stage(stages, op, goals),
        mix=any(c.model for c in op.classes),
        role=role,
        trial_number=record.number,
        measured_at_rps=float(op.target),
        queue_us=float(server.queue_us),
        compute_input_us=float(server.compute_input_us),
        compute_infer_us=float(server.compute_infer_us),
        compute_output_us=float(server.compute_output_us),
        avg_batch_size=float(server.avg_batch_size),
        batch_sizes={int(k): int(v) for k, v in server.batch_sizes.items()},
        execution_count=server.execution_count,
        inference_count=server.inference_count,
        instance_busy_pct=busy,
    )


def _busy_pct(server: ServerView, duration_s: float, instances: int) -> float | None:
    """Share of the window the instances executed (None: no duration)."""
    if duration_s <= 0:
        return None
    # Triton times each execution once per request it served; the per-request average is
    # therefore the per-execution time, and executions x that is the busy time.
    per_execution_us = server.compute_input_us + server.compute_infer_us + server.compute_output_us
    busy_s = server.execution_count * per_execution_us / 1e6
    return round(min(100.0 * busy_s / (duration_s * max(1, instances)), 100.0), 1)


def stage_breakdown(
    record: TrialRecord, server: ServerView, duration_s: float
) -> tuple[StageBreakdown, ...]:
    """A pipeline's composing models at its operating point, in step order."""
    knobs = record.config
    if not isinstance(knobs, JointKnobs) or not server.stages:
        return ()
    rows = []
    for name, stage in knobs.stages:
        view = server.stages.get(name)
        if view is None or not view.execution_count:
            continue
        rows.append(
            StageBreakdown(
                name=name,
                queue_us=float(view.queue_us),
                compute_us=float(
                    view.compute_input_us + view.compute_infer_us + view.compute_output_us
                ),
                avg_batch_size=float(view.avg_batch_size),
                execution_count=view.execution_count,
                instances=stage.instance_count,
                busy_pct=_busy_pct(view, duration_s, stage.instance_count),
            )
        )
    return tuple(rows)


def limiting_stage(
    stages: Sequence[StageBreakdown], point: Measurement | None = None, goals: Goals | None = None
) -> str | None:
    """The stage whose instances were busiest (None: no stage's share is known). A mix of
    models (``point``'s classes name models, ``goals`` given): the model nearest its own p99
    goal, whose goal is what a higher rate would break."""
    mixed = [c for c in point.classes if c.model] if point is not None else []
    if mixed and goals is not None:
        return max(mixed, key=lambda c: c.p99_ms / goals.class_p99_ms(c.name)).model
    ranked = [s for s in stages if s.busy_pct is not None]
    return max(ranked, key=lambda s: s.busy_pct or 0.0).name if ranked else None


def _curve_point(p: Measurement, goals: Goals) -> CurvePoint:
    p99 = as_float(p.p99_ms)
    # The one rule (analyzer.measure.goals.meets_goals): a sequential step is judged by its test,
    # and a step at the boundary meets the goal there, as the capacity search counted it.
    ok, _ = meets_goals(p, goals)
    return CurvePoint(
        offered_rps=float(p.target),
        throughput_rps=float(p.throughput_rps),
        p99_ms=p99 if p99 is not None else 0.0,
        meets_goals=ok,
        stable=p.stable,
        valid=p.valid,
    )


def _load_curve(role: str, record: TrialRecord | None) -> LoadCurve | None:
    if record is None or record.measurement is None:
        return None
    capacity = record.measurement.capacity
    if capacity is None or not capacity.points:
        return None
    points = tuple(
        sorted(
            (_curve_point(p, capacity.goals) for p in capacity.points), key=lambda c: c.offered_rps
        )
    )
    cap = capacity.capacity_rps
    failing = [p.offered_rps for p in points if not p.meets_goals and p.offered_rps > cap]
    return LoadCurve(
        role=role,
        trial_number=record.number,
        points=points,
        capacity_rps=cap,
        first_failing_rps=min(failing) if failing else None,
    )


def _series(
    measurement: Measurement, label: str, role: str, source: str, number: int
) -> TimeSeries | None:
    windows = measurement.windows
    if not windows:
        return None
    end = 0.0
    points = []
    for w in windows:
        end += w.duration_s
        points.append(
            WindowPoint(
                end_s=round(end, 3),
                throughput_rps=w.throughput_rps,
                p99_ms=w.p99_ms,
                offered_rps=w.offered_rps,
                generator_cpu_pct=w.generator_cpu_pct,
            )
        )
    label = with_hits(label, hit_ratio(measurement))
    stable, valid = measurement.stable, measurement.valid
    # The engine's own messages say what went wrong and what to do; generic flags only when
    # it gave none.
    flags = [str(m) for m in measurement.messages]
    if not flags and not valid:
        flags.append("invalid: the load generator saturated, so these numbers describe it")
    if not flags and not stable:
        flags.append("unstable: the last windows disagree by more than the stability threshold")
    return TimeSeries(
        label=label,
        role=role,
        source=source,
        trial_number=number,
        target_rps=float(measurement.target),
        window_s=round(end / len(points), 3),
        points=tuple(points),
        stable=stable,
        valid=valid,
        flags=tuple(dict.fromkeys(flags)),
    )


def _time_series(
    run: RunData,
    roles: Sequence[tuple[str, ConfigResult | None]],
    by_number: Mapping[int, TrialRecord],
) -> tuple[TimeSeries, ...]:
    """Validation runs' windows when recorded; else the search measurement at each operating point."""
    out: list[TimeSeries] = []
    for candidate in run.validation.candidates if run.validation else ():
        number = candidate.trial_number
        for repeat, measured in enumerate(candidate.measurements, start=1):
            op = measured.operating_point() if measured is not None else None
            if op:
                s = _series(
                    op,
                    f"{'baseline' if number < 0 else f'trial {number}'} validation {repeat}",
                    "validation",
                    "validation",
                    number,
                )
                if s:
                    out.append(s)
    for role, result in roles:
        if result is None:
            continue
        record = by_number.get(result.trial_number)
        op = record.operating_point() if record is not None else None
        if op:
            name = "baseline" if role == "baseline" else f"best (trial {result.trial_number})"
            s = _series(op, f"{name} at {op.target:.0f} req/s", role, "search", result.trial_number)
            if s:
                out.append(s)
    return tuple(out)


def _progress(
    objective: Objective,
    trials: Sequence[TrialPoint],
    importances: Mapping[str, float] | None,
    note: str,
) -> Progress:
    higher = objective.higher_is_better
    best: float | None = None
    points = []
    for t in trials:
        if t.number < 0:
            continue
        value = objective_value(objective, t)
        if (
            t.meets_goals
            and value is not None
            and (best is None or (value > best if higher else value < best))
        ):
            best = value
        points.append(ProgressPoint(t.number, value, best, t.meets_goals))
    slices: dict[str, tuple[SlicePoint, ...]] = {}
    for knob, _ in KNOBS:
        rows = []
        for t in trials:
            value = objective_value(objective, t)
            if t.number < 0 or value is None:
                continue
            raw = t.config.get(knob)
            # Preferred sizes are searched as a depth: plot how many sizes were set.
            x = len(raw) if isinstance(raw, list) else raw
            if x is None:
                continue
            rows.append(SlicePoint(t.number, float(x), value, t.meets_goals))
        if len({p.knob_value for p in rows}) > 1:
            slices[knob] = tuple(rows)
    named = None
    if importances is not None:
        named = {knob_of_param(k): round(float(v), 4) for k, v in importances.items()}
        named = dict(sorted(named.items(), key=lambda kv: -kv[1]))
    return Progress(
        objective_name=objective.metric,
        higher_is_better=higher,
        points=tuple(points),
        importances=named,
        importance_note=note,
        slices=slices,
    )
