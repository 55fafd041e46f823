"""Prediction against measurement, the predicted landscape, and where the time went (pure).

``--search predict`` records the simulator's capacity at the goal for every config of the space
(predictions.json, :class:`analyzer.rundir.predictions.Predictions`) and, on each trial it measured,
the prediction it acted on (``TrialRecord.prediction``). The report sets those against what the
capacity search then measured, and draws the whole predicted space. summary.json's ``phases``
say how long each phase of the run took. A run without them (older runs, ``--search tpe``) gets
a reason in ``ReportRecord.missing``, never invented numbers.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from analyzer.config.knobs import Knobs
from analyzer.report.record import (
    Landscape,
    LandscapeCell,
    LandscapeMark,
    PhaseTime,
    PhaseTimes,
    PredictedPoint,
    PredictionCheck,
    TrialPoint,
)
from analyzer.rundir.predictions import Prediction, Predictions
from analyzer.rundir.summary import RunSummary
from analyzer.rundir.trial_record import TrialRecord

#: A prediction within this fraction of the measurement counts as close (the figure's band).
CLOSE = 0.10

#: Phases in the order a run goes through them; others follow in the order recorded.
PHASE_ORDER = ("baseline", "profile", "predict", "search", "validation", "report")

#: ``missing["prediction"]`` for the latency objective (it measures no capacity).
NOT_A_CAPACITY = (
    "not applicable: the latency objective measures one fixed load per config, not a capacity "
    "the simulator could be checked against"
)


def no_predictions_reason(summary: RunSummary, note: str = "") -> str:
    """Why a run has no predictions to show (``note``: why predictions.json was unreadable)."""
    strategy = summary.search_strategy
    ran = f"the search ran {strategy}" if strategy else "the search strategy is not recorded"
    if summary.search_note:
        ran += f": {summary.search_note}"
    text = (
        f"not recorded: the run made no predictions ({ran}; the simulator predicts every "
        "config with --search predict)"
    )
    return f"{text}. {note}" if note else text


def prediction_check(
    records: Sequence[TrialRecord],
    points: Mapping[int, TrialPoint],
    predictions: Predictions | None,
) -> PredictionCheck | None:
    """Every complete capacity measurement that has a prediction, and the errors' summary.

    A trial's own ``prediction`` (what the search acted on before measuring it) comes first;
    a trial whose record holds none takes its config's entry in predictions.json.

    Returns:
        None when no measured config has a prediction.
    """
    out: list[PredictedPoint] = []
    for record in records:
        capacity = record.measurement.capacity if record.measurement is not None else None
        point = points.get(record.number)
        if not record.complete or capacity is None or point is None:
            continue
        source = "trial record"
        predicted: Prediction | None = record.prediction
        if predicted is None and predictions is not None:
            predicted, source = predictions.get(record.config), "predictions.json"
        if predicted is None:
            continue
        measured = float(capacity.capacity_rps)
        error = (predicted.capacity_rps - measured) / measured if measured > 0 else None
        bracketed = bool(capacity.bracketed) and measured > 0
        out.append(
            PredictedPoint(
                trial_number=record.number,
                label=point.label,
                config=dict(point.config),
                measured_rps=measured,
                predicted_rps=predicted.capacity_rps,
                low_rps=predicted.low_rps,
                high_rps=predicted.high_rps,
                relative_error=None if error is None else round(error, 6),
                in_band=predicted.contains(measured),
                meets_goals=point.meets_goals,
                bracketed=bracketed,
                source=source,
            )
        )
    if not out:
        return None
    errors = [
        (abs(p.relative_error), p.trial_number)
        for p in out
        if p.relative_error is not None and p.bracketed
    ]
    median = statistics.median(e for e, _ in errors) if errors else None
    worst = max(errors, default=None)
    check = PredictionCheck(
        points=tuple(out),
        median_abs_error=None if median is None else round(median, 6),
        worst_abs_error=None if worst is None else round(worst[0], 6),
        worst_trial_number=None if worst is None else worst[1],
        within_10pct=sum(e <= CLOSE for e, _ in errors),
        in_band=sum(p.in_band for p in out),
        unmeasured=sum(p.relative_error is None for p in out),
        lower_bounds=sum(p.relative_error is not None and not p.bracketed for p in out),
        summary="",
    )
    return dataclasses.replace(check, summary=_summary(check))


def _summary(check: PredictionCheck) -> str:
    n = len(check.points)
    parts = [f"{n} measured config(s) with a prediction"]
    if check.median_abs_error is not None and check.worst_abs_error is not None:
        where = "baseline" if (check.worst_trial_number or 0) < 0 else "trial"
        which = "" if where == "baseline" else f" {check.worst_trial_number}"
        parts.append(
            f"|predicted - measured| / measured: median {100 * check.median_abs_error:.1f} %, "
            f"worst {100 * check.worst_abs_error:.1f} % ({where}{which})"
        )
        bracketed = n - check.unmeasured - check.lower_bounds
        parts.append(
            f"{check.within_10pct} of {bracketed} within {100 * CLOSE:.0f} %, "
            f"{check.in_band} of {n} inside their prediction band"
        )
    else:
        parts.append("no measured capacity was bracketed, so no error is stated")
    if check.lower_bounds:
        parts.append(
            f"{check.lower_bounds} met the goals up to the highest rate tried (the measured "
            "capacity is a lower bound: not in the error figures)"
        )
    if check.unmeasured:
        parts.append(
            f"{check.unmeasured} met the goals at no load tried (measured 0 req/s: no relative "
            "error)"
        )
    return "; ".join(parts) + "."


def landscape(
    predictions: Predictions | None,
    trials: Sequence[TrialPoint],
    best_number: int | None,
) -> Landscape | None:
    """Predicted capacity per (instances, max batch size, queue delay), measured configs on it.

    Each cell holds the best of the configs that differ only in their preferred sizes: the
    figure has two axes and one panel per instance count, so the third knob is collapsed to its
    best value, and the cell records which list that was.

    Returns:
        None without predictions, or when no predicted config uses the dynamic batcher.
    """
    if predictions is None:
        return None
    # One model's knobs on two axes; a pipeline's predictions have no such landscape.
    batched = [
        (c.config, c.prediction)
        for c in predictions.configs
        if isinstance(c.config, Knobs) and c.config.dynamic_batching
    ]
    cells: dict[tuple[int, int, int], LandscapeCell] = {}
    for k, p in batched:
        key = _cell(k)
        held = cells.get(key)
        count = 1 + (held.configs if held is not None else 0)
        if held is None or p.capacity_rps > held.capacity_rps:
            held = LandscapeCell(
                instance_count=k.instance_count,
                max_batch_size=k.max_batch_size,
                max_queue_delay_us=k.max_queue_delay_us,
                capacity_rps=p.capacity_rps,
                low_rps=p.low_rps,
                high_rps=p.high_rps,
                preferred_batch_size=tuple(k.preferred_batch_size),
                configs=count,
            )
        cells[key] = dataclasses.replace(held, configs=count)
    if not cells:
        return None
    marks: list[LandscapeMark] = []
    outside = 0
    for t in trials:
        if t.state != "complete" or "stages" in t.config:  # a pipeline's: predicted as none
            continue
        knobs = Knobs.from_dict(t.config)
        if not knobs.dynamic_batching or _cell(knobs) not in cells:
            outside += 1
            continue
        role = "baseline" if t.number < 0 else "best" if t.number == best_number else "trial"
        marks.append(
            LandscapeMark(
                trial_number=t.number,
                role=role,
                instance_count=knobs.instance_count,
                max_batch_size=knobs.max_batch_size,
                max_queue_delay_us=knobs.max_queue_delay_us,
                preferred_batch_size=tuple(knobs.preferred_batch_size),
                measured_rps=t.throughput_rps,
                meets_goals=t.meets_goals,
            )
        )
    ordered = tuple(sorted(cells.values(), key=lambda c: _cell_key(c)))
    notes = []
    if any(c.configs > 1 for c in ordered):
        most = max(c.configs for c in ordered)
        notes.append(
            "Preferred sizes collapsed: each cell shows the best predicted capacity of the "
            f"configs that differ only in their preferred sizes (up to {most} per cell); the "
            "cell's best list is in the data."
        )
    if len(batched) < len(predictions.configs):
        notes.append(
            f"{len(predictions.configs) - len(batched)} predicted config(s) without dynamic "
            "batching are not drawn."
        )
    if outside:
        notes.append(
            f"{outside} measured config(s) lie outside the predicted space (or do not batch) "
            "and are not marked."
        )
    return Landscape(
        cells=ordered,
        marks=tuple(marks),
        instance_counts=tuple(sorted({c.instance_count for c in ordered})),
        max_batch_sizes=tuple(sorted({c.max_batch_size for c in ordered})),
        queue_delays_us=tuple(sorted({c.max_queue_delay_us for c in ordered})),
        configs=len(predictions.configs),
        # Ties go to the first cell in display order, so the answer does not depend on the
        # order of predictions.json.
        best=max(ordered, key=lambda c: c.capacity_rps),
        profile=dict(predictions.profile),
        notes=tuple(notes),
    )


def _cell(knobs: Knobs) -> tuple[int, int, int]:
    return (knobs.instance_count, knobs.max_batch_size, knobs.max_queue_delay_us)


def _cell_key(cell: LandscapeCell) -> tuple[int, int, int]:
    return (cell.instance_count, cell.max_batch_size, cell.max_queue_delay_us)


def phase_times(summary: RunSummary) -> PhaseTimes | None:
    """summary.json ``phases`` in run order, with each one's share (None: not recorded)."""
    recorded = {name: max(float(s), 0.0) for name, s in summary.phases.items()}
    if not recorded:
        return None
    names = [n for n in PHASE_ORDER if n in recorded]
    names += [n for n in recorded if n not in PHASE_ORDER]
    total = sum(recorded.values())
    return PhaseTimes(
        phases=tuple(
            PhaseTime(
                name=n,
                seconds=round(recorded[n], 3),
                share=round(recorded[n] / total, 4) if total > 0 else 0.0,
            )
            for n in names
        ),
        total_s=round(total, 3),
        run_duration_s=summary.duration_s,
    )
