"""Building the report record from a run directory's contents (pure: no files, no clock).

Every number in the record is taken from, or computed from, what :func:`load_run` read; parts the
run did not record are left empty with the reason in ``ReportRecord.missing``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from analyzer.report.gpu import (
    NO_GPU_METRIC,
    check_threshold,
    gpu_side,
    gpu_story,
    memory_peak_mb,
    utilization_pct,
    utilization_warnings,
)
from analyzer.report.load import RunData
from analyzer.report.record import (
    KNOBS,
    PARAM_TO_KNOB,
    ConfigResult,
    ConfigTexts,
    CurvePoint,
    LoadCurve,
    Progress,
    ProgressPoint,
    Provenance,
    ReportRecord,
    ServerBreakdown,
    SlicePoint,
    TimeSeries,
    TrialPoint,
    ValidationRow,
    WindowPoint,
    as_float,
)
from analyzer.report.verdict import build_verdict, ceiling_warning, explain
from analyzer.trial import gpu_figures, measurement_problem, percentile_samples


def build_record(run: RunData, *, min_gpu_utilization_pct: float | None = None) -> ReportRecord:
    """Compute the report record from a run directory's contents.

    Args:
        run: What :func:`load_run` read.
        min_gpu_utilization_pct: Model Analyzer's ``--min-gpu-utilization``: configs whose
            operating-point GPU utilisation is below it are flagged (trials table, verdict).

    Returns:
        The record; parts that were not recorded are None/empty with a reason in ``missing``.
    """
    check_threshold(min_gpu_utilization_pct)
    summary = run.summary
    objective = str(summary.get("objective", "throughput"))
    missing: dict[str, str] = {}
    by_number = {int(r["number"]): r for r in run.trials}
    front = _front_numbers(summary, run.trials, objective)
    trials = tuple(_trial_point(r, front, min_gpu_utilization_pct) for r in run.trials)
    points = {t.number: t for t in trials}
    baseline = _config_result("baseline", summary.get("baseline"), points)
    best = _config_result("best", summary.get("best"), points)
    roles = [("baseline", baseline), ("best", best)]

    breakdown = []
    for role, result in roles:
        if result is None:
            continue
        view = _server_breakdown(role, by_number.get(result.trial_number))
        if view is not None:
            breakdown.append(view)
    if not breakdown:
        missing["breakdown"] = (
            "not recorded: the measurements hold no server statistics (the target did not "
            "expose the statistics extension, or the load generator did not scrape it)"
        )

    curves = []
    for role, result in roles:
        if result is None:
            continue
        curve = _load_curve(role, by_number.get(result.trial_number))
        if curve is not None:
            curves.append(curve)
    if not curves:
        missing["load_curves"] = (
            "not recorded: no capacity search points (the latency objective measures one "
            "fixed load per config)"
            if objective == "latency"
            else "not recorded: the trial records hold no capacity search points"
        )

    series = _time_series(run, roles, by_number)
    if not series:
        missing["time_series"] = "not recorded: the measurements hold no per-window results"
    elif not any(s.source == "validation" for s in series):
        missing["validation_series"] = (
            "No validation repeat with per-window results is recorded (validation did not run, "
            "or the run predates recorded validation measurements); shown instead: the search "
            "measurement at each config's operating point."
        )

    progress = _progress(objective, trials, run.importances, run.importance_note)
    if progress.importances is None:
        missing["importance"] = run.importance_note or "not available"

    configs = ConfigTexts(
        best=run.best_config_text,
        baseline=run.baseline_config_text,
        diff=_diff(run.baseline_config_text, run.best_config_text),
    )
    if run.best_config_text is None:
        missing["config"] = "no config met the goals, so there is no best config.pbtxt"

    sides = [
        side
        for role, result in roles
        if (side := gpu_side(role, result, summary.get(role))) is not None
    ]
    gpu = gpu_story(sides) if sides else None
    if gpu is None:
        missing["gpu"] = NO_GPU_METRIC

    validation = _validation_rows(run.validation, best)
    summary_verdict = build_verdict(
        summary, run.run_state, objective, baseline, best, trials, validation
    )
    utilization = utilization_warnings(trials, best, min_gpu_utilization_pct)
    tie_break = summary.get("tie_break")
    summary_verdict = dataclasses.replace(
        summary_verdict,
        warnings=(*summary_verdict.warnings, *utilization),
        min_gpu_utilization_pct=min_gpu_utilization_pct,
        tie_break=str(tie_break) if tie_break else None,
    )
    ceiling = ceiling_warning(summary, best, curves)
    if ceiling:
        summary_verdict = dataclasses.replace(
            summary_verdict, warnings=(*summary_verdict.warnings, ceiling)
        )
    return ReportRecord(
        verdict=summary_verdict,
        trials=trials,
        progress=progress,
        breakdown=tuple(breakdown),
        load_curves=tuple(curves),
        time_series=series,
        validation=validation,
        configs=configs,
        provenance=_provenance(run),
        explanation=explain(breakdown),
        gpu=gpu,
        missing=missing,
    )


def knob_label(config: Mapping[str, Any]) -> str:
    """Short label of a config: ``mbs=16 delay=500us pref=[16,8] x2`` (as Knobs.label)."""
    mbs = config.get("max_batch_size")
    count = config.get("instance_count")
    if config.get("dynamic_batching") is False:
        return f"mbs={mbs} no dynamic batching x{count}"
    pref = ",".join(str(s) for s in config.get("preferred_batch_size") or []) or "-"
    return f"mbs={mbs} delay={config.get('max_queue_delay_us')}us pref=[{pref}] x{count}"


def objective_value(objective: str, point: TrialPoint) -> float | None:
    """The value the search optimised for a trial (throughput, or p99 for ``latency``)."""
    if point.state != "complete":
        return None
    return point.p99_ms if objective == "latency" else point.throughput_rps


def _capacity_part(measurement: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The CapacityResult dict inside a trial's measurement (None for a fixed-load trial)."""
    if not measurement:
        return None
    if "points" in measurement and "capacity_rps" in measurement:
        return measurement
    inner = measurement.get("capacity")
    if isinstance(inner, Mapping) and "points" in inner:
        return inner
    return None


def _operating_point(measurement: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The Measurement dict the trial's reported numbers come from."""
    if not measurement:
        return None
    capacity = _capacity_part(measurement)
    if capacity is None:
        return measurement if "windows" in measurement else None
    if capacity.get("best"):
        return capacity["best"]
    points = capacity.get("points") or []
    # Nothing met the goals: the sweep reports the gentlest level tried.
    return min(points, key=lambda p: p.get("target", math.inf)) if points else None


def _trial_point(
    record: Mapping[str, Any], front: set[int], min_gpu_utilization_pct: float | None = None
) -> TrialPoint:
    config = dict(record.get("config") or {})
    op = _operating_point(record.get("measurement"))
    complete = record.get("state") == "complete"
    values = record.get("values") or []
    gpus = gpu_figures(record.get("measurement")) if complete else None
    util = utilization_pct(gpus)
    return TrialPoint(
        number=int(record["number"]),
        source=str(record.get("source", "")),
        state=str(record.get("state", "")),
        config=config,
        label=knob_label(config),
        throughput_rps=as_float(record.get("throughput_rps")) if complete else None,
        offered_rps=as_float(record.get("offered_rps")) if complete else None,
        p50_ms=as_float(record.get("p50_ms")) if complete else None,
        p90_ms=as_float(record.get("p90_ms")) if complete else None,
        p99_ms=as_float(record.get("p99_ms")) if complete else None,
        error_rate=as_float(record.get("error_rate")) if complete else None,
        # The one rule (analyzer.measure.goals_met): an unusable measurement never meets them,
        # whatever an older record says.
        meets_goals=bool(record.get("meets_goals"))
        and complete
        and measurement_problem(record.get("measurement")) is None,
        failure=record.get("failure"),
        duration_s=as_float(record.get("duration_s")),
        stable=bool(op["stable"]) if op and "stable" in op else None,
        valid=bool(op["valid"]) if op and "valid" in op else None,
        on_front=int(record["number"]) in front,
        reference_p99_ms=as_float(values[1]) if complete and len(values) > 1 else None,
        p99_n=percentile_samples(record.get("measurement")) if complete else None,
        gpu_utilization_pct=round(util, 2) if util is not None else None,
        gpu_memory_peak_mb=memory_peak_mb(gpus),
        below_min_gpu_utilization=(
            util < min_gpu_utilization_pct
            if util is not None and min_gpu_utilization_pct is not None
            else None
        ),
    )


def _front_numbers(
    summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]], objective: str
) -> set[int]:
    """Trials on the throughput/p99 Pareto front (the study's own front for ``pareto``)."""
    if objective == "pareto" and summary.get("pareto"):
        return {int(p["trial_number"]) for p in summary["pareto"] if "trial_number" in p}
    feasible = [
        (int(r["number"]), float(r["throughput_rps"]), float(r["p99_ms"]))
        for r in records
        if r.get("state") == "complete" and r.get("meets_goals") and int(r["number"]) >= 0
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
    role: str, entry: Mapping[str, Any] | None, trials: Mapping[int, TrialPoint]
) -> ConfigResult | None:
    if not entry:
        return None
    config = dict(entry.get("config") or {})
    point = trials.get(int(entry.get("trial_number", -1)))
    return ConfigResult(
        role=role,
        trial_number=int(entry.get("trial_number", -1)),
        config=config,
        label=knob_label(config),
        throughput_rps=float(entry.get("throughput_rps") or 0.0),
        p50_ms=float(entry.get("p50_ms") or 0.0),
        p99_ms=float(entry.get("p99_ms") or 0.0),
        meets_goals=bool(entry.get("meets_goals")),
        validated_throughput_rps=as_float(entry.get("validated_throughput_rps")),
        offered_rps=point.offered_rps if point is not None else None,
        p99_n=int(entry["p99_n"]) if entry.get("p99_n") is not None else None,
        p99_note=entry.get("p99_note"),
    )


def _server_breakdown(role: str, record: Mapping[str, Any] | None) -> ServerBreakdown | None:
    if record is None:
        return None
    op = _operating_point(record.get("measurement"))
    server = (op or {}).get("server")
    if not server or not server.get("execution_count"):
        return None
    config = record.get("config") or {}
    per_execution_us = (
        float(server.get("compute_input_us", 0))
        + float(server.get("compute_infer_us", 0))
        + float(server.get("compute_output_us", 0))
    )
    duration_s = float((op or {}).get("duration_s") or 0.0)
    instances = int(config.get("instance_count") or 1)
    busy = None
    if duration_s > 0:
        # Triton times each execution once per request it served; the per-request average is
        # therefore the per-execution time, and executions x that is the busy time.
        busy_s = int(server["execution_count"]) * per_execution_us / 1e6
        busy = round(min(100.0 * busy_s / (duration_s * instances), 100.0), 1)
    return ServerBreakdown(
        role=role,
        trial_number=int(record["number"]),
        measured_at_rps=float((op or {}).get("target") or 0.0),
        queue_us=float(server.get("queue_us", 0.0)),
        compute_input_us=float(server.get("compute_input_us", 0.0)),
        compute_infer_us=float(server.get("compute_infer_us", 0.0)),
        compute_output_us=float(server.get("compute_output_us", 0.0)),
        avg_batch_size=float(server.get("avg_batch_size", 0.0)),
        batch_sizes={int(k): int(v) for k, v in (server.get("batch_sizes") or {}).items()},
        execution_count=int(server.get("execution_count", 0)),
        inference_count=int(server.get("inference_count", 0)),
        instance_busy_pct=busy,
    )


def _curve_point(p: Mapping[str, Any], goals: Mapping[str, Any]) -> CurvePoint:
    p99 = as_float(p.get("p99_ms"))
    requests = int(p.get("request_count") or 0)
    errors = int(p.get("error_count") or 0)
    error_rate = errors / requests if requests else 1.0
    valid = bool(p.get("valid", True))
    ok = (
        requests > 0
        and valid
        and p99 is not None
        and p99 <= float(goals.get("p99_ms", math.inf))
        and error_rate <= float(goals.get("max_error_rate", 1.0))
    )
    return CurvePoint(
        offered_rps=float(p.get("target") or 0.0),
        throughput_rps=float(p.get("throughput_rps") or 0.0),
        p99_ms=p99 if p99 is not None else 0.0,
        meets_goals=ok,
        stable=bool(p.get("stable", False)),
        valid=valid,
    )


def _load_curve(role: str, record: Mapping[str, Any] | None) -> LoadCurve | None:
    if record is None:
        return None
    capacity = _capacity_part(record.get("measurement"))
    if not capacity or not capacity.get("points"):
        return None
    goals = capacity.get("goals") or {}
    points = tuple(
        sorted((_curve_point(p, goals) for p in capacity["points"]), key=lambda c: c.offered_rps)
    )
    cap = float(capacity.get("capacity_rps") or 0.0)
    failing = [p.offered_rps for p in points if not p.meets_goals and p.offered_rps > cap]
    return LoadCurve(
        role=role,
        trial_number=int(record["number"]),
        points=points,
        capacity_rps=cap,
        first_failing_rps=min(failing) if failing else None,
    )


def _series(
    measurement: Mapping[str, Any], label: str, role: str, source: str, number: int
) -> TimeSeries | None:
    windows = measurement.get("windows") or []
    if not windows:
        return None
    end = 0.0
    points = []
    for w in windows:
        end += float(w.get("duration_s") or 0.0)
        points.append(
            WindowPoint(
                end_s=round(end, 3),
                throughput_rps=float(w.get("throughput_rps") or 0.0),
                p99_ms=float(w.get("p99_ms") or 0.0),
                offered_rps=float(w.get("offered_rps") or 0.0),
                generator_cpu_pct=float(w.get("generator_cpu_pct") or 0.0),
            )
        )
    stable = bool(measurement.get("stable", False))
    valid = bool(measurement.get("valid", False))
    # The engine's own messages say what went wrong and what to do; generic flags only when
    # it gave none.
    flags = [str(m) for m in measurement.get("messages") or ()]
    if not flags and not valid:
        flags.append("invalid: the load generator saturated, so these numbers describe it")
    if not flags and not stable:
        flags.append("unstable: the last windows disagree by more than the stability threshold")
    return TimeSeries(
        label=label,
        role=role,
        source=source,
        trial_number=number,
        target_rps=float(measurement.get("target") or 0.0),
        window_s=round(end / len(points), 3),
        points=tuple(points),
        stable=stable,
        valid=valid,
        flags=tuple(dict.fromkeys(flags)),
    )


def _time_series(
    run: RunData,
    roles: Sequence[tuple[str, ConfigResult | None]],
    by_number: Mapping[int, Mapping[str, Any]],
) -> tuple[TimeSeries, ...]:
    """Validation runs' windows when recorded; else the search measurement at each operating point."""
    out: list[TimeSeries] = []
    for candidate in run.validation or ():
        number = int(candidate.get("trial_number", -1))
        for repeat, raw in enumerate(candidate.get("measurements") or (), start=1):
            op = _operating_point(raw)
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
        op = _operating_point((record or {}).get("measurement"))
        if op:
            name = "baseline" if role == "baseline" else f"best (trial {result.trial_number})"
            s = _series(
                op,
                f"{name} at {float(op.get('target') or 0):.0f} req/s",
                role,
                "search",
                result.trial_number,
            )
            if s:
                out.append(s)
    return tuple(out)


def _progress(
    objective: str,
    trials: Sequence[TrialPoint],
    importances: Mapping[str, float] | None,
    note: str,
) -> Progress:
    higher = objective != "latency"
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
        named = {PARAM_TO_KNOB.get(k, k): round(float(v), 4) for k, v in importances.items()}
        named = dict(sorted(named.items(), key=lambda kv: -kv[1]))
    return Progress(
        objective_name="p99_ms" if objective == "latency" else "throughput_rps",
        higher_is_better=higher,
        points=tuple(points),
        importances=named,
        importance_note=note,
        slices=slices,
    )


def _validation_rows(
    candidates: Sequence[Mapping[str, Any]] | None, best: ConfigResult | None
) -> tuple[ValidationRow, ...]:
    rows = []
    for c in candidates or ():
        number = int(c.get("trial_number", -1))
        rows.append(
            ValidationRow(
                trial_number=number,
                label=knob_label(c.get("config") or {}),
                search_throughput_rps=as_float(c.get("search_throughput_rps")),
                throughput_rps=tuple(float(x) for x in c.get("throughput_rps") or ()),
                p99_ms=tuple(as_float(x) for x in c.get("p99_ms") or ()),
                worst_rps=as_float(c.get("worst_rps")),
                all_meet_goals=bool(c.get("all_meet_goals")),
                chosen=best is not None and best.trial_number == number,
            )
        )
    return tuple(rows)


def _diff(baseline: str | None, best: str | None) -> str | None:
    if baseline is None or best is None:
        return None
    lines = difflib.unified_diff(
        baseline.splitlines(keepends=True),
        best.splitlines(keepends=True),
        fromfile="baseline/config.pbtxt",
        tofile="best/config.pbtxt",
    )
    return "".join(lines)


def _provenance(run: RunData) -> Provenance:
    summary = run.summary
    state = run.run_state or {}
    command = state.get("command")
    if isinstance(command, list):
        command = shlex.join(str(c) for c in command)
    note = ""
    if not command:
        note = (
            "The exact command line is not recorded in run.json; this command reproduces the "
            "run from its resolved scenario."
        )
        command = f"perfsweep run --scenario {run.root / 'scenario.toml'}"
    return Provenance(
        run_id=str(summary.get("run_id", run.root.name)),
        run_dir=str(run.root),
        environment=dict(summary.get("environment") or {}),
        command=str(command),
        command_note=note,
        scenario_toml=run.scenario_toml,
        scenario=dict(summary.get("scenario") or {}),
        started_at=summary.get("started_at"),
        finished_at=summary.get("finished_at"),
        duration_s=as_float(summary.get("duration_s")),
    )
