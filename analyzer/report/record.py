"""The report record: everything the HTML report shows, computed from a run directory as data.

Two steps, so the logic is tested without files or figures::

    load_run(run_dir) -> RunData          I/O: summary.json, trial records, validation.json,
                                          configs, scenario.toml, run.json, the study's importances
    build_record(run) -> ReportRecord     pure: verdict, trials, progress, breakdown, curves, ...

The record is embedded in the HTML as JSON (``ReportRecord.to_dict()``), so tools and tests read
the report without scraping it. A part the run directory does not hold is ``None`` and its reason
is in ``ReportRecord.missing``: the report says "not recorded", it never invents numbers.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.errors import InputError, PerfsweepError
from analyzer.results import RunDirectory, load_summary, load_trial_record, read_json

#: Version of the embedded JSON (``perfsweep-data``); bump on an incompatible change.
REPORT_FORMAT_VERSION = 1

#: Searched knobs in display order, with their units.
KNOBS: tuple[tuple[str, str], ...] = (
    ("max_batch_size", ""),
    ("max_queue_delay_us", "µs"),
    ("preferred_batch_size", ""),
    ("instance_count", ""),
)

#: Optuna parameter (analyzer.search encoding) -> the knob it encodes.
PARAM_TO_KNOB = {
    "log2_mbs": "max_batch_size",
    "delay_idx": "max_queue_delay_us",
    "pref_depth": "preferred_batch_size",
    "instances": "instance_count",
}

#: Search and validation throughput that differ by more than this fraction earn a warning.
VALIDATION_DRIFT = 0.10


# --------------------------------------------------------------------------------------------------
# Input: what a run directory holds


@dataclass(frozen=True)
class RunData:
    """The raw contents of a run directory (parsed JSON and texts, nothing derived).

    Attributes:
        root: The run directory.
        summary: summary.json.
        trials: Trial records (baseline first, then by number).
        run_state: run.json (None when absent).
        validation: validation.json candidates (None when the file is absent).
        best_config_text: best/config.pbtxt (None when no config met the goals).
        baseline_config_text: baseline/config.pbtxt.
        scenario_toml: scenario.toml as written by the sweep.
        importances: Optuna parameter -> importance, or None.
        importance_note: Why importances are missing (empty when present).
    """

    root: Path
    summary: dict[str, Any]
    trials: tuple[dict[str, Any], ...]
    run_state: dict[str, Any] | None = None
    validation: tuple[dict[str, Any], ...] | None = None
    best_config_text: str | None = None
    baseline_config_text: str | None = None
    scenario_toml: str | None = None
    importances: dict[str, float] | None = None
    importance_note: str = ""


def load_run(run_dir: Path, *, importances: bool = True) -> RunData:
    """Read a run directory.

    Args:
        run_dir: A directory written by ``perfsweep run``.
        importances: Compute parameter importances from the stored Optuna study (imports optuna).

    Returns:
        The parsed files.

    Raises:
        ResultFormatError: summary.json or a trial record is missing, damaged or of an unknown
            format version.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise InputError(f"{root} is not a directory; pass a run directory (reports/<run-id>)")
    directory = RunDirectory(root)
    summary = load_summary(directory.summary_json)
    trials = []
    paths = [directory.trial_dir(-1) / "measurement.json"]
    paths += sorted((root / "trials").glob("*/measurement.json"))
    for path in paths:
        if path.exists():
            trials.append(load_trial_record(path))
    trials.sort(key=lambda r: int(r["number"]))
    run_state = None
    if directory.run_json.exists():
        run_state = directory.read_run_state()
    validation = None
    if directory.validation_json.exists():
        doc = read_json(directory.validation_json, "perfsweep.validation")
        validation = tuple(doc.get("candidates", ()))
    importance_values, note = None, ""
    if importances:
        importance_values, note = _importances(summary, run_state, root)
    else:
        note = "not computed (importances disabled)"
    return RunData(
        root=root,
        summary=summary,
        trials=tuple(trials),
        run_state=run_state,
        validation=validation,
        best_config_text=_read_text(root, (summary.get("best") or {}).get("config_path")),
        baseline_config_text=_read_text(root, (summary.get("baseline") or {}).get("config_path")),
        scenario_toml=_read_text(root, "scenario.toml"),
        importances=importance_values,
        importance_note=note,
    )


def _read_text(root: Path, relative: str | None) -> str | None:
    if not relative:
        return None
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):  # a summary must not point outside its run
        return None
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _importances(
    summary: Mapping[str, Any], run_state: Mapping[str, Any] | None, root: Path
) -> tuple[dict[str, float] | None, str]:
    """Importances from the stored study, or None and why not."""
    storage = (run_state or {}).get("storage")
    study_name = (run_state or {}).get("study_name") or (summary.get("study") or {}).get(
        "study_name"
    )
    if not storage or not study_name:
        return None, "not recorded: run.json names no study storage"
    if "://" not in storage:
        # run.json records the journal path as the sweep saw it; a moved directory (a CI
        # artifact) still holds the journal next to run.json.
        local = root / Path(storage).name
        if not Path(storage).exists() and local.exists():
            storage = str(local)
        if not Path(storage).exists():
            return None, f"not available: the study journal {Path(storage).name} is missing"
    from analyzer.search import param_importances  # optuna: only when a report is built

    try:
        return param_importances(storage, study_name), ""
    except PerfsweepError as exc:
        return None, f"not available: {exc}"


# --------------------------------------------------------------------------------------------------
# Output: the record


@dataclass(frozen=True)
class TrialPoint:
    """One measured config as the report shows it (a row of the trials table)."""

    number: int
    source: str
    state: str
    config: dict[str, Any]
    label: str
    throughput_rps: float | None
    offered_rps: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    error_rate: float | None
    meets_goals: bool
    failure: str | None
    duration_s: float | None
    #: The operating-point measurement agreed with itself over its windows (None: not recorded).
    stable: bool | None
    #: The generator kept up (None: not recorded).
    valid: bool | None
    on_front: bool = False
    #: Objective ``pareto``: p99 at the fixed reference load (the front's second objective).
    reference_p99_ms: float | None = None


@dataclass(frozen=True)
class ConfigResult:
    """The baseline or the chosen best."""

    role: str
    trial_number: int
    config: dict[str, Any]
    label: str
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    meets_goals: bool
    validated_throughput_rps: float | None = None
    #: The offered load of the reported numbers (the gentlest level when nothing met the goals).
    offered_rps: float | None = None


@dataclass(frozen=True)
class Verdict:
    """The first thing a reader sees."""

    model: str
    objective: str
    goals: dict[str, Any]
    goals_met: bool
    headline: str
    baseline: ConfigResult | None
    best: ConfigResult | None
    gain: float | None
    device: str
    machine: str
    status: str
    stop_reason: str
    trials: dict[str, int]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class ProgressPoint:
    """Best feasible objective value after trial ``number`` (None before any feasible trial)."""

    number: int
    value: float | None
    best_so_far: float | None
    meets_goals: bool


@dataclass(frozen=True)
class SlicePoint:
    """One trial's value of one knob and its objective value."""

    number: int
    knob_value: float
    objective: float
    meets_goals: bool


@dataclass(frozen=True)
class Progress:
    """Search progress: best so far, parameter importance, per-knob slices."""

    objective_name: str
    higher_is_better: bool
    points: tuple[ProgressPoint, ...]
    importances: dict[str, float] | None
    importance_note: str
    slices: dict[str, tuple[SlicePoint, ...]]


@dataclass(frozen=True)
class ServerBreakdown:
    """Server-side view of one config at its operating point (per successful request)."""

    role: str
    trial_number: int
    measured_at_rps: float
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float
    avg_batch_size: float
    batch_sizes: dict[int, int]
    execution_count: int
    inference_count: int
    #: Share of wall time the instances spent executing: executions x compute time per execution
    #: / (duration x instances). Derived from server statistics; None when not derivable.
    instance_busy_pct: float | None


@dataclass(frozen=True)
class CurvePoint:
    """One load level of a capacity search."""

    offered_rps: float
    throughput_rps: float
    p99_ms: float
    meets_goals: bool
    stable: bool
    valid: bool


@dataclass(frozen=True)
class LoadCurve:
    """Throughput and p99 against offered load, as the capacity search measured them."""

    role: str
    trial_number: int
    points: tuple[CurvePoint, ...]
    capacity_rps: float
    #: The lowest offered load that missed the goals above the capacity (None: not bracketed).
    first_failing_rps: float | None


@dataclass(frozen=True)
class WindowPoint:
    """One measurement window of a time series."""

    end_s: float
    throughput_rps: float
    p99_ms: float
    offered_rps: float
    generator_cpu_pct: float


@dataclass(frozen=True)
class TimeSeries:
    """Per-window throughput and p99 of one measurement, with its self-checks."""

    label: str
    role: str
    source: str
    trial_number: int
    target_rps: float
    window_s: float
    points: tuple[WindowPoint, ...]
    stable: bool
    valid: bool
    flags: tuple[str, ...]


@dataclass(frozen=True)
class ConfigTexts:
    """The best config in full and its diff against the baseline."""

    best: str | None
    baseline: str | None
    diff: str | None


@dataclass(frozen=True)
class Provenance:
    """Where and how the run was produced."""

    run_id: str
    run_dir: str
    environment: dict[str, Any]
    command: str | None
    command_note: str
    scenario_toml: str | None
    scenario: dict[str, Any]
    started_at: str | None
    finished_at: str | None
    duration_s: float | None


@dataclass(frozen=True)
class ValidationRow:
    """One validated candidate: search result vs its re-measurements."""

    trial_number: int
    label: str
    search_throughput_rps: float | None
    throughput_rps: tuple[float, ...]
    p99_ms: tuple[float | None, ...]
    worst_rps: float | None
    all_meet_goals: bool
    chosen: bool


@dataclass(frozen=True)
class ReportRecord:
    """Everything the report shows, as data (embedded in the HTML as JSON)."""

    verdict: Verdict
    trials: tuple[TrialPoint, ...]
    progress: Progress
    breakdown: tuple[ServerBreakdown, ...]
    load_curves: tuple[LoadCurve, ...]
    time_series: tuple[TimeSeries, ...]
    validation: tuple[ValidationRow, ...]
    configs: ConfigTexts
    provenance: Provenance
    #: Plain sentences on why the best beats the baseline, from the server's own statistics.
    explanation: tuple[str, ...] = ()
    #: Report part -> why it is not shown (absent key: shown).
    missing: dict[str, str] = field(default_factory=dict)
    format_version: int = REPORT_FORMAT_VERSION
    kind: str = "perfsweep.report"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (dict keys become strings; inf/nan become None)."""
        return _jsonable(dataclasses.asdict(self))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------------------------------------
# Building the record (pure)


def build_record(run: RunData) -> ReportRecord:
    """Compute the report record from a run directory's contents.

    Args:
        run: What :func:`load_run` read.

    Returns:
        The record; parts that were not recorded are None/empty with a reason in ``missing``.
    """
    summary = run.summary
    objective = str(summary.get("objective", "throughput"))
    missing: dict[str, str] = {}
    by_number = {int(r["number"]): r for r in run.trials}
    front = _front_numbers(summary, run.trials, objective)
    trials = tuple(_trial_point(r, front) for r in run.trials)
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
            "The validation runs' windows are not recorded in the run directory (validation.json "
            "keeps one number per repeat); shown instead: the search measurement at each "
            "config's operating point."
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

    validation = _validation_rows(run.validation, best)
    verdict = _verdict(summary, run.run_state, objective, baseline, best, trials, validation)
    ceiling = _ceiling_warning(summary, best, curves)
    if ceiling:
        verdict = dataclasses.replace(verdict, warnings=(*verdict.warnings, ceiling))
    return ReportRecord(
        verdict=verdict,
        trials=trials,
        progress=progress,
        breakdown=tuple(breakdown),
        load_curves=tuple(curves),
        time_series=series,
        validation=validation,
        configs=configs,
        provenance=_provenance(run),
        explanation=explain(breakdown),
        missing=missing,
    )


def _ceiling_warning(
    summary: Mapping[str, Any], best: ConfigResult | None, curves: Sequence[LoadCurve]
) -> str | None:
    """A best config that never failed below the rate ceiling has an unknown true capacity."""
    curve = next((c for c in curves if c.role == "best"), None)
    if best is None or curve is None or curve.first_failing_rps is not None:
        return None
    traffic = (summary.get("scenario") or {}).get("traffic") or {}
    ceiling = traffic.get("max_rate_rps")
    where = f"traffic.max_rate_rps ({ceiling:g} req/s)" if ceiling else "the highest rate tried"
    return (
        f"The best config met the goals at every load tried, up to {where}: its real capacity "
        "may be higher. Raise traffic.max_rate_rps (within what this load generator can send)."
    )


def explain(breakdown: Sequence[ServerBreakdown]) -> tuple[str, ...]:
    """Why the best config serves more: batching, compute per request, queueing, instances.

    Triton charges every request of a batch the whole execution's compute time, so compute per
    request divided by the mean batch size is what one request really costs the device.
    """
    views = {b.role: b for b in breakdown}
    base, best = views.get("baseline"), views.get("best")
    if base is None or best is None:
        return ()
    out = [
        f"Measured at each config's own operating point: {best.measured_at_rps:.0f} req/s for the "
        f"best, {base.measured_at_rps:.0f} req/s for the baseline."
    ]
    out.append(
        f"Batching: {best.avg_batch_size:.2f} requests per execution vs "
        f"{base.avg_batch_size:.2f} for the baseline."
    )
    if best.avg_batch_size > 0 and base.avg_batch_size > 0:
        cost_best = best.compute_infer_us / best.avg_batch_size / 1000
        cost_base = base.compute_infer_us / base.avg_batch_size / 1000
        out.append(
            f"Device time per request (compute infer / mean batch): {cost_best:.3f} ms vs "
            f"{cost_base:.3f} ms."
        )
    out.append(
        f"Time queued per request: {best.queue_us / 1000:.3f} ms vs {base.queue_us / 1000:.3f} ms."
    )
    if best.instance_busy_pct is not None and base.instance_busy_pct is not None:
        out.append(
            f"Instances busy: {best.instance_busy_pct:.0f} % vs {base.instance_busy_pct:.0f} % "
            "of the measurement."
        )
    return tuple(out)


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


def _num(value: Any) -> float | None:
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _trial_point(record: Mapping[str, Any], front: set[int]) -> TrialPoint:
    config = dict(record.get("config") or {})
    op = _operating_point(record.get("measurement"))
    complete = record.get("state") == "complete"
    values = record.get("values") or []
    return TrialPoint(
        number=int(record["number"]),
        source=str(record.get("source", "")),
        state=str(record.get("state", "")),
        config=config,
        label=knob_label(config),
        throughput_rps=_num(record.get("throughput_rps")) if complete else None,
        offered_rps=_num(record.get("offered_rps")) if complete else None,
        p50_ms=_num(record.get("p50_ms")) if complete else None,
        p90_ms=_num(record.get("p90_ms")) if complete else None,
        p99_ms=_num(record.get("p99_ms")) if complete else None,
        error_rate=_num(record.get("error_rate")) if complete else None,
        meets_goals=bool(record.get("meets_goals")) and complete,
        failure=record.get("failure"),
        duration_s=_num(record.get("duration_s")),
        stable=bool(op["stable"]) if op and "stable" in op else None,
        valid=bool(op["valid"]) if op and "valid" in op else None,
        on_front=int(record["number"]) in front,
        reference_p99_ms=_num(values[1]) if complete and len(values) > 1 else None,
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
        validated_throughput_rps=_num(entry.get("validated_throughput_rps")),
        offered_rps=point.offered_rps if point is not None else None,
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
    p99 = _num(p.get("p99_ms"))
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
                search_throughput_rps=_num(c.get("search_throughput_rps")),
                throughput_rps=tuple(float(x) for x in c.get("throughput_rps") or ()),
                p99_ms=tuple(_num(x) for x in c.get("p99_ms") or ()),
                worst_rps=_num(c.get("worst_rps")),
                all_meet_goals=bool(c.get("all_meet_goals")),
                chosen=best is not None and best.trial_number == number,
            )
        )
    return tuple(rows)


def _machine(env: Mapping[str, Any]) -> str:
    gpus = env.get("gpu") or []
    gpu = ", ".join(str(g) for g in gpus) if gpus else "no GPU"
    return f"{env.get('host', '?')}: {env.get('cpu', '?')} x{env.get('cpu_count', '?')}, {gpu}"


def _verdict(
    summary: Mapping[str, Any],
    run_state: Mapping[str, Any] | None,
    objective: str,
    baseline: ConfigResult | None,
    best: ConfigResult | None,
    trials: Sequence[TrialPoint],
    validation: Sequence[ValidationRow],
) -> Verdict:
    goals = dict(summary.get("goals") or {})
    env = summary.get("environment") or {}
    counts = dict(summary.get("trials") or {})
    status = str((run_state or {}).get("status") or "unknown")
    stop_reason = str(summary.get("stop_reason", ""))
    gain = _num(summary.get("gain"))
    goals_met = best is not None and best.meets_goals
    p99_goal = goals.get("p99_ms")

    if best is None:
        headline = f"No config met the goals (p99 ≤ {p99_goal} ms)."
    elif objective == "latency":
        headline = f"Best config: p99 {best.p99_ms:.1f} ms (goal ≤ {p99_goal} ms)"
        if gain is not None and baseline is not None:
            headline += f", {gain:.2f}x lower than the baseline's {baseline.p99_ms:.1f} ms."
        else:
            headline += "; the baseline missed the goals, so there is no gain to state."
    else:
        # Search numbers throughout (throughput, p99 and the gain come from one measurement);
        # the validation's worst case is stated beside them, not mixed in.
        headline = (
            f"Best config serves {best.throughput_rps:.1f} req/s within p99 ≤ {p99_goal} ms "
            f"(p99 {best.p99_ms:.1f} ms)"
        )
        if gain is not None and baseline is not None:
            headline += f": {gain:.2f}x the baseline's {baseline.throughput_rps:.1f} req/s."
        else:
            headline += "; the baseline missed the goals, so there is no gain to state."
        if best.validated_throughput_rps is not None:
            headline += (
                f" Re-measured in validation: {best.validated_throughput_rps:.1f} req/s "
                "(worst repeat)."
            )

    warnings: list[str] = []
    if status not in ("completed", "unknown"):
        warnings.append(f"The run is {status}: the results cover only the trials that finished.")
    if stop_reason == "interrupted":
        warnings.append("The sweep was interrupted; resume it with `perfsweep run --resume`.")
    if summary.get("device") == "sim":
        warnings.append(
            "Measured on the simulated device: latencies come from a latency profile, not real "
            "hardware. Use them to compare configs, not as the accelerator's real capacity."
        )
    if baseline is not None and not baseline.meets_goals:
        warnings.append("The baseline config missed the goals, so no gain over it is stated.")
    failed = [t for t in trials if t.state != "complete"]
    if failed:
        reasons = "; ".join(dict.fromkeys((t.failure or "unknown")[:120] for t in failed[:3]))
        warnings.append(f"{len(failed)} trial(s) failed: {reasons}")
    invalid = [t.number for t in trials if t.valid is False]
    if invalid:
        warnings.append(
            f"{len(invalid)} measurement(s) were generator-saturated (trials "
            f"{_numbers_text(invalid)}): their numbers describe the load generator."
        )
    unstable = [t.number for t in trials if t.stable is False]
    if unstable:
        warnings.append(
            f"{len(unstable)} measurement(s) did not stabilise (trials "
            f"{_numbers_text(unstable)}): treat their numbers as rough."
        )
    for row in validation:
        name = "The baseline" if row.trial_number < 0 else f"Trial {row.trial_number}"
        if not row.all_meet_goals:
            warnings.append(f"{name} missed the goals when re-measured in validation.")
        elif row.search_throughput_rps and row.worst_rps is not None:
            drift = abs(row.worst_rps - row.search_throughput_rps) / row.search_throughput_rps
            if drift > VALIDATION_DRIFT:
                warnings.append(
                    f"{name}: validation measured {row.worst_rps:.1f} req/s "
                    f"(worst case) vs {row.search_throughput_rps:.1f} req/s in the search "
                    f"({drift:.0%} apart): measurements on this machine are noisy."
                )
    return Verdict(
        model=str(summary.get("model", "")),
        objective=objective,
        goals=goals,
        goals_met=goals_met,
        headline=headline,
        baseline=baseline,
        best=best,
        gain=gain,
        device=str(summary.get("device", "")),
        machine=_machine(env),
        status=status,
        stop_reason=stop_reason,
        trials=counts,
        warnings=tuple(warnings),
    )


def _numbers_text(numbers: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join("baseline" if n < 0 else str(n) for n in numbers[:limit])
    return shown + (f" and {len(numbers) - limit} more" if len(numbers) > limit else "")


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
        import shlex

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
        duration_s=_num(summary.get("duration_s")),
    )


__all__ = [
    "REPORT_FORMAT_VERSION",
    "ReportRecord",
    "RunData",
    "build_record",
    "load_run",
]
