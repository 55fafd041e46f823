"""Building the report record from a run directory's contents (pure: no files, no clock).

Every number in the record is taken from, or computed from, what :func:`load_run` read; parts the
run did not record are left empty with the reason in ``ReportRecord.missing``.

A throughput measured while the response cache answered requests is not the model's: every
label shown beside such a figure (trials, baseline and best, validation rows, time series, GPU
table) ends in its hit ratio (`` · 90 % cache hits``), and the verdict warns once.

A run with a priority mix (``[[traffic.classes]]``) gets a per-class table for the best and the
baseline config (:class:`~analyzer.report.classes.ClassTable`): each class's priority, share,
p99 against its own goal and errors, at the config's operating point.

:func:`build_record` is here; the parts it assembles live beside it: ``points`` (trial points,
front, config results, cache hit ratios), ``series`` (load curves, time series, progress) and
``classes`` (the per-class tables).
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
from collections.abc import Mapping, Sequence

from analyzer.config.objective import Objective, objective_for
from analyzer.report.classes import ClassedReportRecord, class_tables, run_goals
from analyzer.report.gpu import (
    NO_GPU_METRIC,
    check_threshold,
    gpu_side,
    gpu_story,
    utilization_warnings,
)
from analyzer.report.points import (
    _config_result,
    _front_numbers,
    _record_ratio,
    _trial_point,
    cache_warning,
    hit_ratio,
    with_hits,
)
from analyzer.report.prediction import (
    NOT_A_CAPACITY,
    landscape,
    no_predictions_reason,
    phase_times,
    prediction_check,
)
from analyzer.report.record import (
    ConfigResult,
    ConfigTexts,
    Landscape,
    PredictionCheck,
    Provenance,
    ReportRecord,
    TrialPoint,
    ValidationRow,
    as_float,
)
from analyzer.report.rundir import RunData
from analyzer.report.series import _load_curve, _progress, _server_breakdown, _time_series
from analyzer.report.shapes import shape_table
from analyzer.report.tokens import token_story
from analyzer.report.verdict import build_verdict, ceiling_warning, explain
from analyzer.rundir.trial_record import TrialRecord
from analyzer.rundir.validation import Validation


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
    goals = run_goals(run)
    for role, result in roles:
        if result is None:
            continue
        view = _server_breakdown(role, by_number.get(result.trial_number), goals)
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
    if batches := (summary.batching or {}).get("note"):
        summary_verdict = dataclasses.replace(
            summary_verdict, warnings=(*summary_verdict.warnings, batches)
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
    labels = {t.number: t.label for t in trials}
    record = dataclasses.replace(
        record, shapes=shape_table(run.trials, labels), tokens=token_story(run.trials)
    )
    tables = class_tables(run, roles, by_number)
    if not tables:
        return record
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(ReportRecord)}
    return ClassedReportRecord(**fields, classes=tables)


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
