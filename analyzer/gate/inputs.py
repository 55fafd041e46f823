"""Reading results into a :class:`~analyzer.gate.verdict.GateInput`: a run directory, a
``summary.json`` or a ``perfsweep load --output`` document.

The headline numbers, the repeated samples behind them and the facts that decide whether
two results may be compared. Pure from parsed documents; :func:`read_result` (last) is the
only function that touches files.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from analyzer.config.objective import Objective, gentlest, objective_for, worst_value
from analyzer.errors import InputError, ResultFormatError
from analyzer.gate.verdict import GateInput, TokenFigures
from analyzer.measure.generator import read_load_output
from analyzer.measure.measurement import Measurement, WindowStats
from analyzer.measure.specs import LoadMode
from analyzer.rundir.measurements import FixedMeasurement
from analyzer.rundir.records import SUMMARY_KIND, load_summary, load_trial
from analyzer.rundir.summary import RunSummary
from analyzer.rundir.trial_record import TrialRecord


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def token_figures(measurements: Sequence[Measurement]) -> TokenFigures | None:
    """The token streams of repeats of one level (each repeat a sample, the median the
    headline), or of one measurement (sampled by its windows' TTFT and ITL p99 where they
    have them; tokens/s is one sample); None unless every one streamed tokens."""
    stats = [m.tokens for m in measurements]
    if not stats or any(t is None for t in stats):
        return None
    ttft = tuple(t.ttft_p99_ms for t in stats if t is not None)
    itl = tuple(t.itl_p99_ms for t in stats if t is not None)
    rate = tuple(t.output_tokens_per_s for t in stats if t is not None)
    figures = TokenFigures(_median(ttft), _median(itl), _median(rate), ttft, itl, rate)
    if len(measurements) == 1:
        return _by_windows(figures, measurements[0].windows)
    return figures


def _by_windows(figures: TokenFigures, windows: Sequence[WindowStats]) -> TokenFigures:
    """``figures`` (one measurement's) with its windows' TTFT and ITL p99 as their samples,
    when two or more windows recorded them; the headline stays the measurement's own."""
    ttft = tuple(w.ttft_p99_ms for w in windows if w.ttft_p99_ms is not None)
    itl = tuple(w.itl_p99_ms for w in windows if w.itl_p99_ms is not None)
    if len(ttft) < 2 or len(itl) < 2:
        return figures
    return dataclasses.replace(figures, ttft_p99_samples=ttft, itl_p99_samples=itl)


def _entry_tokens(figures: Mapping[str, float | None] | None) -> TokenFigures | None:
    """A summary entry's token figures (one sample each); None without them."""
    if not figures:
        return None
    ttft, itl, rate = (figures.get(k) for k in ("ttft_p99_ms", "itl_p99_ms", "output_tokens_per_s"))
    if ttft is None or itl is None or rate is None:
        return None
    return TokenFigures(ttft, itl, rate, (ttft,), (itl,), (rate,))


def from_measurements(
    measurements: Sequence[Measurement],
    label: str,
    environment: Mapping[str, str | None],
) -> GateInput:
    """Repeats of one fixed load level (or a single measurement, sampled by its windows)."""
    if not measurements:
        raise InputError(f"{label}: no measurement to gate")
    notes = []
    for i, m in enumerate(measurements, start=1):
        where = f"{label} repeat {i}" if len(measurements) > 1 else label
        # Stability is not required: the gate's repeats and rank test are its answer to noise.
        if not m.valid:
            notes.append(
                f"{where}: invalid measurement (generator limits): {'; '.join(m.messages)}"
            )
    requests = sum(m.request_count for m in measurements)
    errors = sum(m.error_count for m in measurements)
    if len(measurements) > 1:
        tp = tuple(m.throughput_rps for m in measurements)
        p99 = tuple(m.p99_ms for m in measurements)
        return GateInput(
            label,
            _median(tp),
            _median(p99),
            errors / requests if requests else 1.0,
            tp,
            p99,
            "repeats",
            dict(environment),
            tuple(notes),
            token_figures(measurements),
        )
    m = measurements[0]
    windows = [w for w in m.windows if w.request_count > 0]
    if len(windows) >= 2:
        tp = tuple(w.throughput_rps for w in windows)
        p99 = tuple(w.p99_ms for w in windows)
        basis = "windows"
    else:
        tp, p99, basis = (m.throughput_rps,), (m.p99_ms,), "single"
    error_rate = m.error_rate if requests else 1.0
    return GateInput(
        label,
        m.throughput_rps,
        m.p99_ms,
        error_rate,
        tp,
        p99,
        basis,
        dict(environment),
        tuple(notes),
        token_figures(measurements),
    )


def level_name(m: Measurement) -> str:
    """``request_rate 50`` / ``concurrency 8``: what a fixed-level throughput means."""
    return f"{m.mode.value} {m.target:g}"


def from_load_document(doc: Mapping[str, Any], label: str, level: float | None = None) -> GateInput:
    """A ``perfsweep load --output`` (or ``perfsweep gate --output``) document.

    With a capacity search the headline is the capacity; otherwise one load level is judged:
    ``level`` (its target), else the only level, else the highest one. Several results at the
    same level are repeats.
    """
    measurements, capacity = read_load_output(doc)
    env_doc = doc.get("environment") or {}
    env: dict[str, str | None] = {
        "model": _str(env_doc.get("model")),
        "device": _str(env_doc.get("device")),
        "gpu": _str(env_doc.get("gpu")),
        "scenario_hash": _str(env_doc.get("scenario_hash")),
        "host": _str(env_doc.get("host")),
    }
    if capacity is not None and level is None:
        env["measure"] = f"capacity at {capacity.goals.describe()}"
        point = capacity.best or gentlest(capacity.points)
        p99 = point.p99_ms if point else math.inf
        err = point.error_rate if point else 1.0
        notes = () if capacity.bracketed else (f"{label}: capacity not bracketed",)
        return GateInput(
            label,
            capacity.capacity_rps,
            p99,
            err,
            (capacity.capacity_rps,),
            (p99,),
            "single",
            env,
            notes,
            token_figures([point]) if point else None,
        )
    levels: dict[tuple[LoadMode, float], list[Measurement]] = {}
    for m in measurements:
        levels.setdefault((m.mode, m.target), []).append(m)
    if not levels:
        raise InputError(f"{label} holds no measurement")
    if level is not None:
        chosen = [k for k in levels if k[1] == level]
        if not chosen:
            have = ", ".join(f"{t:g}" for _, t in levels)
            raise InputError(f"{label} has no load level {level:g} (levels: {have}); fix --level")
        key = chosen[0]
    else:
        key = max(levels, key=lambda k: k[1])
    picked = levels[key]
    env["measure"] = level_name(picked[0])
    result = from_measurements(picked, label, env)
    if len(levels) > 1 and level is None:
        note = (
            f"{label}: judged the highest load level ({level_name(picked[0])}); pick with --level"
        )
        result = dataclasses.replace(result, notes=(*result.notes, note))
    return result


def from_summary(
    summary: RunSummary,
    label: str,
    trial_record: TrialRecord | None = None,
) -> GateInput:
    """A sweep's ``summary.json`` (and, from a run directory, the chosen trial's record).

    The chosen config is ``best`` (the baseline config when nothing met the sweep's goals).
    When validation re-measured it, its repeats are the samples and their worst case the
    headline (:meth:`Objective.repeat_figure`, the figure the report states too: longer windows
    than the search step); otherwise, for a fixed-load trial, the trial record's windows are the
    samples; else the single search value. A generative model's token figures are the trial
    record's operating point's (sampled by its windows' TTFT and ITL where recorded), else the
    summary entry's (one sample).
    """
    notes: list[str] = []
    entry = summary.best
    if entry is None:
        entry = summary.baseline
        notes.append(f"{label}: no config met the sweep's goals; judging the baseline config")
    if entry is None:
        raise InputError(f"{label} has neither a best nor a baseline result")
    if not entry.meets_goals:
        notes.append(f"{label}: the judged config missed the sweep's own goals")
    objective = objective_for(summary.objective)
    environment = summary.environment
    gpu = environment.get("gpu")
    env: dict[str, str | None] = {
        "model": _str(summary.model),
        "device": _str(summary.device),
        "gpu": (", ".join(gpu) or None) if isinstance(gpu, list) else _str(gpu),
        "scenario_hash": _str(environment.get("scenario_hash")),
        "measure": objective.measure_text(summary.goals, summary.scenario.get("traffic") or {}),
        "host": _str(environment.get("host")),
    }
    throughput, p99 = entry.throughput_rps, entry.p99_ms
    tp_samples: tuple[float, ...] = (throughput,)
    p99_samples: tuple[float, ...] = (p99,)
    basis = "single"
    number = entry.trial_number
    candidate = summary.candidate(number)
    if candidate is not None and candidate.throughput_rps and candidate.p99_ms:
        # Validation re-measured the chosen config with longer windows: trust it over the
        # search step, and judge the worst repeat, as the sweep chose and the report states.
        tp_samples, p99_samples = candidate.throughput_rps, candidate.p99_ms
        throughput = _repeat_figure(objective, "throughput_rps", tp_samples)
        p99 = _repeat_figure(objective, "p99_ms", p99_samples)
        basis = "repeats" if len(tp_samples) > 1 else "single"
        notes.append(
            f"{label}: judged the validation repeats of trial {number}, not its search step"
        )
        missed = [i for i, ok in enumerate(candidate.meets_goals, start=1) if not ok]
        if missed:
            # The sweep's one rule (analyzer.measure.goals.goals_met): such a repeat's numbers may
            # describe a saturated generator, not the server.
            notes.append(
                f"{label}: validation repeat(s) {', '.join(map(str, missed))} of trial "
                f"{number} missed the sweep's goals (invalid or beyond the goal)"
            )
    error_rate = None
    # The entry's own figures (summary.json alone), else the trial record's operating point's.
    tokens = _entry_tokens(entry.tokens)
    if trial_record is not None:
        error_rate = trial_record.error_rate
        measured = trial_record.measurement
        if basis == "single" and isinstance(measured, FixedMeasurement):
            windows = [w for w in measured.level.windows if w.request_count > 0]
            if len(windows) >= 2:
                tp_samples = tuple(w.throughput_rps for w in windows)
                p99_samples = tuple(w.p99_ms for w in windows)
                basis = "windows"
        point = trial_record.operating_point()
        tokens = (token_figures([point]) if point is not None else None) or tokens
        if tokens is not None and basis == "repeats":
            notes.append(
                f"{label}: the token figures are trial {number}'s search step, one sample "
                "(the validation repeats are request figures)"
            )
    return GateInput(
        label,
        throughput,
        p99,
        error_rate,
        tp_samples,
        p99_samples,
        basis,
        env,
        tuple(notes),
        tokens,
    )


def _repeat_figure(objective: Objective, metric: str, values: Sequence[float]) -> float:
    """The headline of repeated values: :meth:`Objective.repeat_figure` for the objective's own
    metric, the same worst-repeat rule (:func:`analyzer.config.objective.worst_value`) for the other."""
    if metric == objective.metric:
        return objective.repeat_figure(values)
    return worst_value(metric, values)


def _str(value: Any) -> str | None:
    return None if value is None or value == [] else str(value)


def read_result(path: Path, level: float | None = None) -> GateInput:
    """Read a run directory, a ``summary.json`` or a ``perfsweep load``/``gate`` output file.

    Raises:
        InputError: The path does not exist or holds no result.
        ResultFormatError: A result of a format version this perfsweep cannot read.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"result {path} does not exist")
    if path.is_dir():
        if not (path / "summary.json").is_file():
            raise InputError(
                f"{path} is not a finished run directory (no summary.json); pass a run directory, "
                "a summary.json or a `perfsweep load --output` file"
            )
        path = path / "summary.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {path} as JSON: {exc}") from exc
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind == SUMMARY_KIND:
        summary = load_summary(path)  # version check with the run directory's own message
        record = None
        chosen = summary.chosen
        if chosen is not None:
            number = chosen.trial_number
            name = "baseline" if number < 0 else f"trials/{number:03d}"
            trial_path = path.parent / name / "measurement.json"
            if trial_path.is_file():
                record = load_trial(trial_path)
        return from_summary(
            summary, str(path.parent if path.name == "summary.json" else path), record
        )
    if kind == "perfsweep.load":
        return from_load_document(doc, str(path), level)
    raise ResultFormatError(
        f"{path} is not a perfsweep result (kind={kind!r}); pass a run directory, a summary.json "
        "or a `perfsweep load --output` file"
    )
