"""Building the report record from a run directory's contents (pure: no files, no clock).

Every number in the record is taken from, or computed from, what :func:`load_run` read; parts the
run did not record are left empty with the reason in ``ReportRecord.missing``.

A throughput measured while the response cache answered requests is not the model's: every
label shown beside such a figure (trials, baseline and best, validation rows, time series, GPU
table) ends in its hit ratio (`` · 90 % cache hits``), and the verdict warns once.

A run with a priority mix (``[[traffic.classes]]``) gets a per-class table for the best and the
baseline config (:class:`ClassTable`): each class's priority, share, p99 against its own goal
and errors, at the config's operating point.
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.config.objective import Objective, objective_for
from analyzer.errors import InputError
from analyzer.measure.goals import class_slacks, meets_goals
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import Goals, LoadMode
from analyzer.report.gpu import (
    NO_GPU_METRIC,
    check_threshold,
    gpu_side,
    gpu_story,
    memory_peak_mb,
    utilization_pct,
    utilization_warnings,
)
from analyzer.report.prediction import (
    NOT_A_CAPACITY,
    landscape,
    no_predictions_reason,
    phase_times,
    prediction_check,
)
from analyzer.report.record import (
    KNOBS,
    ConfigResult,
    ConfigTexts,
    CurvePoint,
    Landscape,
    LoadCurve,
    PredictionCheck,
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
    knob_of_param,
)
from analyzer.report.rundir import RunData
from analyzer.report.verdict import build_verdict, ceiling_warning, explain
from analyzer.rundir.summary import ConfigEntry, RunSummary
from analyzer.rundir.trial_record import TrialRecord
from analyzer.rundir.validation import Validation
from analyzer.target.server_stats import cache_hit_ratio, cache_hits_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class ClassRow:
    """One traffic class at a config's operating point."""

    name: str
    #: Priority level sent (0: none, the model's default level).
    priority: int
    #: Share of the offered load.
    share: float
    #: ``timeout`` parameter sent, microseconds (0: none).
    timeout_us: int
    request_count: int
    error_count: int
    error_rate: float
    p50_ms: float
    p99_ms: float
    #: The class's own p99 goal (the run's ``goals.p99_ms`` when it has none).
    goal_p99_ms: float
    #: p99 within its goal and errors within the error budget (a class without requests: None).
    meets_goal: bool | None


@dataclass(frozen=True)
class ClassTable:
    """The traffic classes of one config (best or baseline) at its operating point."""

    role: str
    trial_number: int
    #: The operating point's load, in ``unit``.
    measured_at: float
    #: ``req/s`` (open loop) or ``users`` (closed loop).
    unit: str
    rows: tuple[ClassRow, ...]


@dataclass(frozen=True)
class ClassedReportRecord(ReportRecord):
    """A :class:`ReportRecord` with the per-class tables of a run with a priority mix.

    Only runs with traffic classes get one (every other record, and its JSON, is as before).
    """

    classes: tuple[ClassTable, ...] = ()


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
    objective = objective_for(summary.objective)
    missing: dict[str, str] = {}
    by_number = {r.number: r for r in run.trials}
    front = _front_numbers(summary, run.trials, objective)
    trials = tuple(_trial_point(r, front, min_gpu_utilization_pct) for r in run.trials)
    points = {t.number: t for t in trials}
    baseline = _config_result("baseline", summary.baseline, points, by_number)
    best = _config_result("best", summary.best, points, by_number)
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
            if not objective.capacity
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

    entries = {"baseline": summary.baseline, "best": summary.best}
    sides = [
        side
        for role, result in roles
        if (side := gpu_side(role, result, entries[role])) is not None
    ]
    gpu = gpu_story(sides) if sides else None
    if gpu is None:
        missing["gpu"] = NO_GPU_METRIC

    prediction, space = _predicted(run, objective, trials, points, best, missing)
    phases = phase_times(summary)
    if phases is None:
        missing["phases"] = "not recorded: summary.json holds no phase times (an older run)"

    validation = _validation_rows(run.validation, best, by_number)
    summary_verdict = build_verdict(
        summary, run.run_state, objective, baseline, best, trials, validation
    )
    utilization = utilization_warnings(trials, best, min_gpu_utilization_pct)
    summary_verdict = dataclasses.replace(
        summary_verdict,
        warnings=(*summary_verdict.warnings, *utilization),
        min_gpu_utilization_pct=min_gpu_utilization_pct,
        tie_break=summary.tie_break or None,
        search_strategy=summary.search_strategy,
        search_note=summary.search_note or None,
    )
    cached = cache_warning(run.trials)
    if cached:
        summary_verdict = dataclasses.replace(
            summary_verdict, warnings=(*summary_verdict.warnings, cached)
        )
    ceiling = ceiling_warning(summary, best, curves)
    if ceiling:
        summary_verdict = dataclasses.replace(
            summary_verdict, warnings=(*summary_verdict.warnings, ceiling)
        )
    record = ReportRecord(
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
        prediction=prediction,
        landscape=space,
        phases=phases,
        missing=missing,
    )
    tables = class_tables(run, roles, by_number)
    if not tables:
        return record
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(ReportRecord)}
    return ClassedReportRecord(**fields, classes=tables)


def run_goals(run: RunData) -> Goals | None:
    """The run's goals with each traffic class's own p99 goal (from ``scenario.toml``); None
    when the summary records no p99 goal."""
    goals = dict(run.summary.goals)
    if not goals.get("p99_ms"):
        return None
    classes: list[Any] = []
    if run.scenario_toml:
        try:
            classes = tomllib.loads(run.scenario_toml).get("traffic", {}).get("classes", [])
        except tomllib.TOMLDecodeError:
            classes = []
    p99_ms, max_error_rate = float(goals["p99_ms"]), float(goals.get("max_error_rate", 0.0))
    own = tuple((str(c["name"]), float(c["p99_ms"])) for c in classes if c.get("p99_ms", 0) > 0)
    try:
        return Goals(p99_ms=p99_ms, max_error_rate=max_error_rate, classes=own)
    except InputError:  # goals no sweep accepts (a class's above the run's): the run's for all
        return Goals(p99_ms=p99_ms, max_error_rate=max_error_rate)


def class_tables(
    run: RunData,
    roles: Sequence[tuple[str, ConfigResult | None]],
    records: Mapping[int, TrialRecord],
) -> tuple[ClassTable, ...]:
    """Per-class tables of the ``roles`` (best, baseline) whose operating point has traffic
    classes; empty for a run without a priority mix."""
    goals = run_goals(run)
    out = []
    for role, result in roles:
        record = records.get(result.trial_number) if result is not None else None
        op = record.operating_point() if record is not None else None
        if record is None or op is None or not op.classes or goals is None:
            continue
        # The one rule: a class meets its goal when its slacks are satisfied.
        slacks = class_slacks(op, goals)
        rows = []
        for c in op.classes:
            met = all(v <= 0 for v in slacks[c.name].values()) if c.name in slacks else None
            rows.append(
                ClassRow(
                    name=c.name,
                    priority=c.priority,
                    share=c.share,
                    timeout_us=c.timeout_us,
                    request_count=c.request_count,
                    error_count=c.error_count,
                    error_rate=c.error_rate,
                    p50_ms=c.p50_ms,
                    p99_ms=c.p99_ms,
                    goal_p99_ms=goals.class_p99_ms(c.name),
                    meets_goal=met,
                )
            )
        unit = "req/s" if op.mode is LoadMode.REQUEST_RATE else "users"
        out.append(ClassTable(role, record.number, float(op.target), unit, tuple(rows)))
    return tuple(out)


def _predicted(
    run: RunData,
    objective: Objective,
    trials: Sequence[TrialPoint],
    points: Mapping[int, TrialPoint],
    best: ConfigResult | None,
    missing: dict[str, str],
) -> tuple[PredictionCheck | None, Landscape | None]:
    """Predicted vs measured capacity and the predicted landscape, or why each is missing."""
    prediction = None
    if not objective.capacity:
        missing["prediction"] = NOT_A_CAPACITY
    elif (prediction := prediction_check(run.trials, points, run.predictions)) is None:
        if run.predictions is None and not any(r.prediction for r in run.trials):
            missing["prediction"] = no_predictions_reason(run.summary, run.predictions_note)
        else:
            missing["prediction"] = (
                "not recorded: no complete capacity measurement has a prediction to set it against"
            )
    space = landscape(run.predictions, trials, best.trial_number if best else None)
    if space is None:
        if run.predictions_note:
            missing["landscape"] = run.predictions_note
        elif run.predictions is None:
            missing["landscape"] = (
                "not recorded: the run directory holds no predictions.json (written by "
                "--search predict)"
            )
        else:
            missing["landscape"] = "not shown: no predicted config uses the dynamic batcher"
    return prediction, space


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


def _server_breakdown(role: str, record: TrialRecord | None) -> ServerBreakdown | None:
    if record is None:
        return None
    op = record.operating_point()
    server = op.server if op is not None else None
    if op is None or server is None or not server.execution_count:
        return None
    per_execution_us = server.compute_input_us + server.compute_infer_us + server.compute_output_us
    duration_s = op.duration_s
    instances = record.config.instance_count or 1
    busy = None
    if duration_s > 0:
        # Triton times each execution once per request it served; the per-request average is
        # therefore the per-execution time, and executions x that is the busy time.
        busy_s = server.execution_count * per_execution_us / 1e6
        busy = round(min(100.0 * busy_s / (duration_s * instances), 100.0), 1)
    return ServerBreakdown(
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


def _curve_point(p: Measurement, goals: Goals) -> CurvePoint:
    p99 = as_float(p.p99_ms)
    # The one rule (analyzer.measure.goals.meets_goals): a sequential step is judged by its test, and
    # a step at the boundary meets the goal there, as the capacity search counted it.
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


def _validation_rows(
    validation: Validation | None,
    best: ConfigResult | None,
    records: Mapping[int, TrialRecord],
) -> tuple[ValidationRow, ...]:
    rows = []
    for c in validation.candidates if validation else ():
        # The repeats' own hit ratio (their hits over their lookups), else the search's.
        repeats = [
            m.operating_point() for m in c.measurements if m is not None and m.operating_point()
        ]
        ratios = [r for r in (hit_ratio(op) for op in repeats) if r is not None]
        ratio = sum(ratios) / len(ratios) if ratios else _record_ratio(records.get(c.trial_number))
        rows.append(
            ValidationRow(
                trial_number=c.trial_number,
                label=with_hits(c.config.label(), ratio),
                search_throughput_rps=as_float(c.search_throughput_rps),
                throughput_rps=c.throughput_rps,
                p99_ms=tuple(as_float(x) for x in c.p99_ms),
                worst_rps=as_float(c.worst_rps),
                all_meet_goals=c.all_meet_goals,
                chosen=best is not None and best.trial_number == c.trial_number,
                check_rps=as_float(c.check_rps),
                check_met=c.check_met,
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
        run_id=summary.run_id or run.root.name,
        run_dir=str(run.root),
        environment=dict(summary.environment),
        command=str(command),
        command_note=note,
        scenario_toml=run.scenario_toml,
        scenario=dict(summary.scenario),
        started_at=summary.started_at,
        finished_at=summary.finished_at,
        duration_s=as_float(summary.duration_s),
    )
