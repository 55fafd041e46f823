"""The report record: everything the HTML report shows, as typed data.

The record is computed in two steps, so the logic is tested without files or figures::

    load_run(run_dir) -> RunData          analyzer.report.rundir: read the run directory (I/O)
    build_record(run) -> ReportRecord     analyzer.report.build: derive everything (pure)

It is embedded in the HTML as JSON (``ReportRecord.to_dict()``), so tools and tests read the
report without scraping it. A part the run directory does not hold is ``None``/empty and its
reason is in ``ReportRecord.missing``: the report says "not recorded", it never invents numbers.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analyzer.documents import FORMATS, REPORT_KIND

if TYPE_CHECKING:  # the figures module imports matplotlib; the record is data only
    from analyzer.report.tokens import TokenStory

#: Version of the embedded JSON (``perfsweep-data``): :data:`analyzer.documents.FORMATS`'s.
REPORT_FORMAT_VERSION = FORMATS[REPORT_KIND].current

#: Searched knobs in display order, with their units.
KNOBS: tuple[tuple[str, str], ...] = (
    ("max_batch_size", ""),
    ("max_queue_delay_us", "µs"),
    ("preferred_batch_size", ""),
    ("instance_count", ""),
)

#: Optuna parameter (analyzer.search.study encoding) -> the knob it encodes.
PARAM_TO_KNOB = {
    "log2_mbs": "max_batch_size",
    "delay_idx": "max_queue_delay_us",
    "pref_depth": "preferred_batch_size",
    "instances": "instance_count",
    "cache_idx": "response_cache",
    "policy_idx": "queue_policy",
    "cand_idx": "max_candidate_sequences",
    "kind_idx": "instance_kind",
    "ragged_idx": "ragged_batch",
}


def knob_of_param(param: str) -> str:
    """The knob a study parameter searches (``instances_1``: group 1's instance count;
    ``infer.log2_mbs``: a pipeline's composing model ``infer``'s max batch size)."""
    stage, dot, own = param.partition(".")
    if dot:
        return f"{stage}: {knob_of_param(own)}"
    head, _, group = param.rpartition("_")
    if head == "instances" and group.isdigit():
        return f"instance_count (group {group})"
    return PARAM_TO_KNOB.get(param, param)


@dataclass(frozen=True)
class ShapePick:
    """The config that served the most under one arrival shape (or in the worst case), as its
    search trial measured it, with its capacity under every shape."""

    #: ``poisson``, a shape's short form, or ``worst case`` (what the run ranks by).
    chosen_for: str
    trial_number: int
    label: str
    #: req/s under each of :attr:`ShapeTable.shapes`, in that order.
    capacities: tuple[float, ...]


@dataclass(frozen=True)
class ShapeTable:
    """Side by side: the pick for each arrival shape and the worst-case pick."""

    shapes: tuple[str, ...]
    picks: tuple[ShapePick, ...]


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
    #: Latencies behind the percentiles (None: not recorded).
    p99_n: int | None = None
    #: GPU utilisation at the operating point, percent (mean over the GPUs; None: no GPU metric).
    gpu_utilization_pct: float | None = None
    #: Peak memory of the fullest GPU at the operating point, MiB (None: no GPU metric).
    gpu_memory_peak_mb: float | None = None
    #: Below ``--min-gpu-utilization`` at the operating point (None: no threshold or no figure).
    below_min_gpu_utilization: bool | None = None


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
    #: Latencies behind the percentiles (None: not recorded).
    p99_n: int | None = None
    #: Set when the p99 rests on fewer than ``analyzer.measure.gain.LOW_SAMPLE_P99`` samples.
    p99_note: str | None = None


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
    #: Bootstrap interval of the gain and whether it excludes 1.0 (None: not recorded).
    gain_ci: tuple[float | None, float | None] | None = None
    gain_significant: bool | None = None
    #: The gain sentence the console and summary.json print
    #: (``analyzer.measure.gain.gain_sentence``).
    gain_text: str = ""
    #: ``goal p99 <= X ms: why`` (the scenario's ``goals.note``).
    goal_text: str = ""
    #: Footnotes on the percentiles shown (low-sample p99s).
    footnotes: tuple[str, ...] = ()
    #: ``perfsweep report --min-gpu-utilization`` (percent; None: not asked for).
    min_gpu_utilization_pct: float | None = None
    #: Why the chosen config won a tie on throughput (summary.json ``tie_break``; None: no tie).
    tie_break: str | None = None
    #: What the gain is a ratio of (``Objective.gain_label``: ``best / baseline throughput``).
    gain_label: str = ""
    #: The search that ran (``predict``, ``tpe``, ``random``, ``grid``; None: not recorded).
    search_strategy: str | None = None
    #: Why it is not the one asked for (summary.json ``search_note``; None: nothing to say).
    search_note: str | None = None


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
class StageBreakdown:
    """One composing model of a pipeline at the pipeline's operating point (its own statistics,
    per request it served)."""

    name: str
    queue_us: float
    #: compute input + infer + output.
    compute_us: float
    avg_batch_size: float
    execution_count: int
    instances: int
    #: Executions x compute per execution / (duration x instances); None: not derivable.
    busy_pct: float | None


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
    #: A pipeline's composing models, in step order, or a mix's models (empty for one model).
    stages: tuple[StageBreakdown, ...] = ()
    #: The stage whose instances were busiest: the one that limits the pipeline's capacity; in a
    #: mix of models, the model nearest its own p99 goal.
    limiting_stage: str | None = None
    #: ``stages`` are a mix's models served together, not a pipeline's steps.
    mix: bool = False


@dataclass(frozen=True)
class GpuSide:
    """The baseline's or the best's GPUs at its operating point (summary.json ``gpus``).

    Over several GPUs: utilisation is the mean of each GPU's mean (p95: the highest), memory the
    fullest GPU's peak, power the sum; throughput per GPU-percent divides by the summed
    utilisation, so it reads "requests per second that one percent of one GPU serves".
    """

    role: str
    trial_number: int
    label: str
    throughput_rps: float
    gpu_count: int
    utilization_pct_mean: float | None
    utilization_pct_p95: float | None
    memory_used_peak_mb: float | None
    memory_total_mb: float | None
    power_mean_w: float | None
    power_limit_w: float | None
    throughput_per_gpu_pct: float | None
    throughput_per_watt: float | None
    #: The per-GPU figures as summary.json holds them.
    gpus: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class GpuStory:
    """Utilisation, memory and power of the baseline and the best, side by side."""

    sides: tuple[GpuSide, ...]
    #: Plain sentences comparing the two (empty with one side).
    sentences: tuple[str, ...]


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
    #: ``budget.validation = "check"``: the rate of the sequential check (the winner's
    #: capacity) and whether the config served it (None: no check, or it did not complete).
    check_rps: float | None = None
    check_met: bool | None = None


@dataclass(frozen=True)
class PredictedPoint:
    """One measured config: the simulator's capacity at the goal against the measured one."""

    trial_number: int
    label: str
    config: dict[str, Any]
    #: The capacity the trial's search measured (0: it met the goals at no load tried).
    measured_rps: float
    predicted_rps: float
    #: The prediction's band (``predictions.Prediction.low_rps``/``high_rps``).
    low_rps: float
    high_rps: float
    #: (predicted - measured) / measured; None when nothing was measured to divide by.
    relative_error: float | None
    #: The measured capacity lies inside the prediction band.
    in_band: bool
    meets_goals: bool
    #: The search found a failing load above the capacity; False: the measured capacity is a
    #: lower bound (it met the goals up to the highest rate tried), left out of the error figures.
    bracketed: bool
    #: ``trial record`` (what the search predicted before measuring it) or ``predictions.json``
    #: (the space-wide prediction, for a trial whose record holds none).
    source: str


@dataclass(frozen=True)
class PredictionCheck:
    """Predicted against measured capacity over every measured config that has a prediction."""

    points: tuple[PredictedPoint, ...]
    #: Median and largest |predicted - measured| / measured over the points whose capacity the
    #: search bracketed (the others are a lower bound or nothing).
    median_abs_error: float | None
    worst_abs_error: float | None
    worst_trial_number: int | None
    #: Bracketed points within 10 % of the measurement; points inside their own band.
    within_10pct: int
    in_band: int
    #: Points without a measured capacity (met the goals at no load tried).
    unmeasured: int
    #: Points whose measured capacity is a lower bound (no failing load up to the ceiling).
    lower_bounds: int
    #: The caption's numbers as one sentence.
    summary: str


@dataclass(frozen=True)
class LandscapeCell:
    """The best predicted config of one (instances, max batch size, queue delay) cell."""

    instance_count: int
    max_batch_size: int
    max_queue_delay_us: int
    capacity_rps: float
    low_rps: float
    high_rps: float
    #: Preferred sizes of the cell's best config (the cell collapses every preferred list).
    preferred_batch_size: tuple[int, ...]
    #: Predicted configs collapsed into the cell.
    configs: int


@dataclass(frozen=True)
class LandscapeMark:
    """A measured config placed on the landscape."""

    trial_number: int
    role: str
    instance_count: int
    max_batch_size: int
    max_queue_delay_us: int
    preferred_batch_size: tuple[int, ...]
    measured_rps: float | None
    meets_goals: bool


@dataclass(frozen=True)
class Landscape:
    """predictions.json over max batch size x queue delay, one panel per instance count."""

    cells: tuple[LandscapeCell, ...]
    marks: tuple[LandscapeMark, ...]
    instance_counts: tuple[int, ...]
    max_batch_sizes: tuple[int, ...]
    queue_delays_us: tuple[int, ...]
    #: Predicted configs in predictions.json (all of them, before collapsing).
    configs: int
    #: The highest predicted cell.
    best: LandscapeCell
    #: What the simulator ran on (predictions.json ``profile``, shown as is).
    profile: dict[str, Any]
    #: How the configs were collapsed, and what was left out.
    notes: tuple[str, ...]


@dataclass(frozen=True)
class PhaseTime:
    """Wall time of one phase of the run."""

    name: str
    seconds: float
    #: Share of the recorded phases' total (0..1).
    share: float


@dataclass(frozen=True)
class PhaseTimes:
    """Where the run's wall time went (summary.json ``phases``)."""

    phases: tuple[PhaseTime, ...]
    total_s: float
    #: The run's own wall time (summary.json ``duration_s``; None: not recorded).
    run_duration_s: float | None


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
    #: GPU figures of baseline and best (None: no GPU metric; the reason in ``missing["gpu"]``).
    gpu: GpuStory | None = None
    #: Predicted against measured capacity (None: no predictions; ``missing["prediction"]``).
    prediction: PredictionCheck | None = None
    #: The predicted capacity of the whole space (None: no predictions.json;
    #: ``missing["landscape"]``).
    landscape: Landscape | None = None
    #: Seconds per phase (None: not recorded; ``missing["phases"]``).
    phases: PhaseTimes | None = None
    #: Report part -> why it is not shown (absent key: shown).
    missing: dict[str, str] = field(default_factory=dict)
    format_version: int = REPORT_FORMAT_VERSION
    kind: str = REPORT_KIND
    #: Each arrival shape's pick beside the worst-case pick (None: the run had one shape).
    shapes: ShapeTable | None = None
    #: A generative sweep's token streams per config (None: requests answered once).
    tokens: TokenStory | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (dict keys become strings; inf/nan become None); ``shapes`` only
        for a run with several arrival shapes and ``tokens`` only for a generative sweep, so
        every other report reads as before."""
        out: dict[str, Any] = jsonable(dataclasses.asdict(self))
        for key in ("shapes", "tokens"):
            if out.get(key) is None:
                out.pop(key, None)
        return out


def jsonable(value: Any) -> Any:
    """``value`` with string dict keys and non-finite floats as None (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def as_float(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, not a number, inf or nan)."""
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None
