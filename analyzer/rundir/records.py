"""The typed records of a run directory: summary.json, trial records and validation.json.

This module alone turns those files into objects and back; the report, the gate and the sweep
read and write them through it::

    RunSummary   summary.json                 load_summary(path)     write_summary(path, s)
    TrialRecord  trials/NNN/measurement.json  load_trial(path)       write_trial(path, r)
                 (and baseline/)
    Validation   validation.json              load_validation(path)  write_validation(path, v)
    Predictions  predictions.json             load_predictions(path) write_predictions(path, p)

Each record is a frozen dataclass with ``to_dict()`` (the file's JSON, version header included)
and ``from_dict()`` (its inverse, which also reads every older version it knows). A trial's
measurement is one of three typed shapes, told apart by :attr:`TrialMeasurement.kind`, so no
reader has to guess it from the keys:

    CapacityMeasurement  a capacity search (objective ``throughput``)
    FixedMeasurement     one fixed load level (objective ``latency``)
    ParetoMeasurement    a capacity search plus the reference level (objective ``pareto``)

Loaders refuse a file of another kind, or of a version newer than (or unknown to) this
perfsweep, with :class:`~analyzer.errors.ResultFormatError` saying what to do; a damaged file
(a required key missing, a value of the wrong type) is refused the same way.

Format versions: each record's kind has its current version, its history (the optional keys
each version gained over time) and its migrations in :data:`analyzer.documents.FORMATS`; every
``to_dict()`` writes that version and every ``from_dict()`` lifts an older one through it.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from analyzer.config.knobs import Knobs
from analyzer.documents import (
    FORMATS,
    PREDICTIONS_KIND,
    SUMMARY_KIND,
    TRIAL_KIND,
    VALIDATION_KIND,
    header,
    read_document,
    refuse_version,
    write_json,
)
from analyzer.errors import ResultFormatError
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.gain import LOW_SAMPLE_P99, p99_sample_note
from analyzer.measure.goals import goals_met, unusable
from analyzer.measure.measurement import GpuStats, Measurement, gentlest


class StopReason(str, enum.Enum):
    """Why a sweep's search ended: summary.json's ``stop_reason`` (the value is what is written).

    A file written before the key existed reads as :attr:`NOT_RECORDED` (``""``, written back as
    it was read).
    """

    #: ``budget.trials`` trials were started.
    TRIALS = "trials"
    #: ``budget.time_budget_s`` ran out.
    TIME_BUDGET = "time_budget"
    #: ``budget.patience`` trials without a feasible improvement of ``budget.min_improvement``.
    STAGNATION = "stagnation"
    #: ``--search predict``: the measured best lies in the predicted best's band.
    PREDICTION = "prediction"
    #: ``--search grid``: every config of the grid was measured.
    GRID = "grid"
    #: Ctrl-C (or a kill): run.json says ``interrupted``; ``--resume`` goes on.
    INTERRUPTED = "interrupted"
    #: The server died and could not be brought back: run.json says ``failed``.
    SERVER_DIED = "server_died"
    #: Not in the file (written before summary.json recorded it).
    NOT_RECORDED = ""

    def __str__(self) -> str:
        return str(self.value)


#: The per-GPU figures a summary entry keeps (``measure.GpuStats`` less its samples).
GPU_FIGURE_KEYS = (
    "uuid",
    "name",
    "utilization_pct_mean",
    "utilization_pct_p95",
    "memory_used_peak_mb",
    "memory_total_mb",
    "power_mean_w",
    "power_limit_w",
)


def _knobs(data: Mapping[str, Any]) -> Knobs:
    return Knobs.from_dict(data)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


# --------------------------------------------------------------------------------------------------
# Measurements


class MeasurementKind(str, enum.Enum):
    """Which of the three shapes a trial's measurement has."""

    CAPACITY = "capacity"
    FIXED = "fixed"
    PARETO = "pareto"


class TrialMeasurement(abc.ABC):
    """What a trial measured; one subclass per shape (:class:`MeasurementKind`)."""

    kind: ClassVar[MeasurementKind]

    @property
    @abc.abstractmethod
    def capacity(self) -> CapacityResult | None:
        """The capacity search (None for a fixed-load trial)."""

    @property
    @abc.abstractmethod
    def fixed(self) -> Measurement | None:
        """The fixed level: the latency objective's level, pareto's reference level."""

    def operating_point(self) -> Measurement | None:
        """The level the trial's numbers rest on: the fixed level (``latency``), else the capacity
        search's best point, else its gentlest point (:func:`analyzer.measure.measurement.gentlest`, the
        one copy of that rule); None when nothing was measured."""
        if self.capacity is None:
            return self.fixed
        return self.capacity.best or gentlest(self.capacity.points)

    @abc.abstractmethod
    def problem(self) -> str | None:
        """Why the measurement cannot meet any goal (:func:`analyzer.measure.goals.unusable`), else None."""

    def request_count(self) -> int | None:
        """Latencies behind the reported percentiles (None: nothing measured)."""
        point = self.operating_point()
        return None if point is None else point.request_count

    def gpus(self) -> tuple[GpuStats, ...]:
        """The GPUs the server reported at the operating point (empty: none reported)."""
        point = self.operating_point()
        return point.server.gpus if point is not None and point.server is not None else ()

    def gpu_figures(self) -> list[dict[str, Any]] | None:
        """The summary entry's ``gpus``: :data:`GPU_FIGURE_KEYS` per GPU, None without a GPU."""
        gpus = self.gpus()
        if not gpus:
            return None
        return [{k: getattr(g, k) for k in GPU_FIGURE_KEYS} for g in gpus]

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The ``measurement`` JSON of a trial record (the engine's own ``to_dict``)."""


@dataclass(frozen=True)
class CapacityMeasurement(TrialMeasurement):
    """A capacity search: the highest rate (or concurrency) meeting the goals."""

    result: CapacityResult
    kind: ClassVar[MeasurementKind] = MeasurementKind.CAPACITY

    @property
    def capacity(self) -> CapacityResult:
        return self.result

    @property
    def fixed(self) -> None:
        return None

    def problem(self) -> str | None:
        # The search's best passed meets_goals by construction; without one, the capacity is 0.
        return unusable(self.result.best) if self.result.best is not None else None

    def to_dict(self) -> dict[str, Any]:
        return self.result.to_dict()


@dataclass(frozen=True)
class FixedMeasurement(TrialMeasurement):
    """One fixed load level (the offered rate or concurrency of the scenario)."""

    level: Measurement
    kind: ClassVar[MeasurementKind] = MeasurementKind.FIXED

    @property
    def capacity(self) -> None:
        return None

    @property
    def fixed(self) -> Measurement:
        return self.level

    def problem(self) -> str | None:
        return unusable(self.level)

    def to_dict(self) -> dict[str, Any]:
        return self.level.to_dict()


@dataclass(frozen=True)
class ParetoMeasurement(TrialMeasurement):
    """A capacity search and the p99 at the fixed reference load (the front's two values)."""

    result: CapacityResult
    reference: Measurement
    kind: ClassVar[MeasurementKind] = MeasurementKind.PARETO

    @property
    def capacity(self) -> CapacityResult:
        return self.result

    @property
    def fixed(self) -> Measurement:
        return self.reference

    def problem(self) -> str | None:
        problem = unusable(self.reference)
        return f"reference load: {problem}" if problem else None

    def to_dict(self) -> dict[str, Any]:
        return {"capacity": self.result.to_dict(), "reference": self.reference.to_dict()}


def measurement_from_dict(raw: Mapping[str, Any] | None) -> TrialMeasurement | None:
    """A trial's ``measurement`` JSON as its typed shape (None when not recorded).

    Version 1 does not name the shape; this is the one place that reads it from the keys.

    Raises:
        ResultFormatError: The JSON has none of the three shapes.
    """
    if not raw:
        return None
    if "capacity" in raw and "reference" in raw:
        return ParetoMeasurement(
            CapacityResult.from_dict(raw["capacity"]), Measurement.from_dict(raw["reference"])
        )
    if "points" in raw and "capacity_rps" in raw:
        return CapacityMeasurement(CapacityResult.from_dict(raw))
    if "mode" in raw:
        return FixedMeasurement(Measurement.from_dict(raw))
    raise ResultFormatError(
        f"a measurement with keys {sorted(raw)[:6]} is none of capacity, fixed or pareto"
    )


def _measurement_dict(m: TrialMeasurement | None) -> dict[str, Any] | None:
    return None if m is None else m.to_dict()


# --------------------------------------------------------------------------------------------------
# Predictions


@dataclass(frozen=True)
class Prediction:
    """The simulator's capacity at the goal for one config, and its band (req/s).

    ``low_rps``/``high_rps`` bound what a measurement may show and still agree with the
    prediction (``--search predict`` stops once the measured best falls inside the band of the
    predicted best).
    """

    capacity_rps: float
    low_rps: float
    high_rps: float

    def contains(self, rps: float) -> bool:
        """Whether a measured capacity agrees with the prediction."""
        return self.low_rps <= rps <= self.high_rps

    def to_dict(self) -> dict[str, float]:
        return {
            "capacity_rps": self.capacity_rps,
            "low_rps": self.low_rps,
            "high_rps": self.high_rps,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Prediction:
        return cls(float(d["capacity_rps"]), float(d["low_rps"]), float(d["high_rps"]))


def _opt_prediction(raw: Mapping[str, Any] | None) -> Prediction | None:
    return None if not raw else Prediction.from_dict(raw)


@dataclass(frozen=True)
class ConfigPrediction:
    """One config of the space and its :class:`Prediction` (an entry of predictions.json)."""

    config: Knobs
    prediction: Prediction

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), **self.prediction.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ConfigPrediction:
        return cls(_knobs(d["config"]), Prediction.from_dict(d))


@dataclass(frozen=True)
class Predictions:
    """predictions.json: the simulator's capacity for every config of the space.

    ``profile`` is a short description of the profile the simulator ran on (shown, not computed
    with); ``configs`` are in the space's order.
    """

    profile: dict[str, Any] = field(default_factory=dict)
    configs: tuple[ConfigPrediction, ...] = ()

    def get(self, config: Knobs) -> Prediction | None:
        """The prediction of ``config`` (None: not in the space predicted)."""
        return next((c.prediction for c in self.configs if c.config == config), None)

    def ranked(self) -> list[ConfigPrediction]:
        """Highest predicted capacity first (ties in the space's order)."""
        return sorted(self.configs, key=lambda c: -c.prediction.capacity_rps)

    def to_dict(self) -> dict[str, Any]:
        return {
            **header(PREDICTIONS_KIND),
            "profile": dict(self.profile),
            "configs": [c.to_dict() for c in self.configs],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Predictions:
        def parse() -> Predictions:
            d = _migrate(PREDICTIONS_KIND, data)
            return cls(
                dict(d.get("profile") or {}),
                tuple(ConfigPrediction.from_dict(c) for c in d.get("configs") or ()),
            )

        return _parsing(PREDICTIONS_KIND, parse)


# --------------------------------------------------------------------------------------------------
# Trial record


@dataclass(frozen=True)
class TrialRecord:
    """One measured config: a search trial, the baseline (number -1) or a validation repeat.

    The sweep builds it as it measures (and hands it to its observer); on disk it is
    ``trials/NNN/measurement.json`` (``baseline/`` for number -1; docs/reference.md, "Trial
    record"). Everything derived from the measurement (its operating point, GPU figures, sample
    count, whether it is usable) is asked of the typed :attr:`measurement`.
    """

    number: int
    source: str
    state: str
    config: Knobs
    throughput_rps: float = 0.0
    offered_rps: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    error_rate: float = 0.0
    #: As recorded; :attr:`feasible` applies the one rule to records that predate it.
    meets_goals: bool = False
    #: Slacks (<= 0: satisfied), e.g. ``p99_slack``.
    constraints: dict[str, float] = field(default_factory=dict)
    #: The objective values told to the search (pareto: throughput, reference p99).
    values: tuple[float, ...] = ()
    failure: str | None = None
    started_at: str = ""
    duration_s: float = 0.0
    measurement: TrialMeasurement | None = None
    #: The simulator's capacity for this config (``--search predict``; None: not predicted).
    prediction: Prediction | None = None

    @property
    def complete(self) -> bool:
        return self.state == "complete"

    @property
    def feasible(self) -> bool:
        """Complete and meeting the goals on a usable measurement (``analyzer.measure.goals.goals_met``).

        Records written before the one rule could say an unusable measurement met the goals.
        """
        return self.complete and self.meets_goals and goals_met(self.problem(), {})

    def problem(self) -> str | None:
        """See :meth:`TrialMeasurement.problem` (None when not recorded)."""
        return self.measurement.problem() if self.measurement is not None else None

    def operating_point(self) -> Measurement | None:
        """See :meth:`TrialMeasurement.operating_point` (None when not recorded)."""
        return self.measurement.operating_point() if self.measurement is not None else None

    def request_count(self) -> int | None:
        """Latencies behind the reported percentiles (None: not recorded)."""
        return self.measurement.request_count() if self.measurement is not None else None

    def gpu_figures(self) -> list[dict[str, Any]] | None:
        """See :meth:`TrialMeasurement.gpu_figures` (None when not recorded)."""
        return self.measurement.gpu_figures() if self.measurement is not None else None

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON, version header first."""
        return {
            **header(TRIAL_KIND),
            "number": self.number,
            "source": self.source,
            "state": self.state,
            "config": self.config.to_dict(),
            "throughput_rps": self.throughput_rps,
            "offered_rps": self.offered_rps,
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "p99_ms": self.p99_ms,
            "error_rate": self.error_rate,
            "meets_goals": self.meets_goals,
            "constraints": dict(self.constraints),
            "values": list(self.values),
            "failure": self.failure,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "measurement": _measurement_dict(self.measurement),
            "prediction": None if self.prediction is None else self.prediction.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialRecord:
        """Inverse of :meth:`to_dict` (also without the version header)."""
        return _parsing(TRIAL_KIND, lambda: cls._from_dict(_migrate(TRIAL_KIND, data)))

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> TrialRecord:
        return cls(
            number=int(d["number"]),
            source=str(d["source"]),
            state=str(d["state"]),
            config=_knobs(d["config"]),
            throughput_rps=float(d.get("throughput_rps", 0.0)),
            offered_rps=float(d.get("offered_rps", 0.0)),
            p50_ms=float(d.get("p50_ms", 0.0)),
            p90_ms=float(d.get("p90_ms", 0.0)),
            p99_ms=float(d.get("p99_ms", 0.0)),
            error_rate=float(d.get("error_rate", 0.0)),
            meets_goals=bool(d.get("meets_goals", False)),
            constraints={str(k): float(v) for k, v in (d.get("constraints") or {}).items()},
            values=tuple(float(v) for v in d.get("values") or ()),
            failure=_opt_str(d.get("failure")),
            started_at=str(d.get("started_at") or ""),
            duration_s=float(d.get("duration_s") or 0.0),
            measurement=measurement_from_dict(d.get("measurement")),
            prediction=_opt_prediction(d.get("prediction")),
        )


# --------------------------------------------------------------------------------------------------
# Validation


@dataclass(frozen=True)
class ValidationCandidate:
    """One config re-measured in validation: every repeat's numbers and their worst case."""

    trial_number: int
    config: Knobs
    search_throughput_rps: float
    #: Per repeat.
    throughput_rps: tuple[float, ...]
    p99_ms: tuple[float, ...]
    meets_goals: tuple[bool, ...]
    worst_rps: float
    worst_p99_ms: float | None
    all_meet_goals: bool
    #: Latencies behind each repeat's p99 (empty: not recorded).
    p99_n: tuple[int | None, ...] = ()
    #: Each repeat's measurement (empty: not recorded; an entry is None for a failed repeat).
    measurements: tuple[TrialMeasurement | None, ...] = ()
    #: ``budget.validation = "check"``: the rate of the sequential check (the winner's
    #: capacity), whether the config served it, and the check's measurement. The check is the
    #: one repeat unless the whole capacity was re-measured (the two best within noise): the
    #: repeats are then the re-measurements. None: no check (repeats validation, older files).
    check_rps: float | None = None
    check_met: bool | None = None
    check: TrialMeasurement | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial_number": self.trial_number,
            "config": self.config.to_dict(),
            "search_throughput_rps": self.search_throughput_rps,
            "throughput_rps": list(self.throughput_rps),
            "p99_ms": list(self.p99_ms),
            "p99_n": list(self.p99_n),
            "meets_goals": list(self.meets_goals),
            "measurements": [_measurement_dict(m) for m in self.measurements],
            "worst_rps": self.worst_rps,
            "worst_p99_ms": self.worst_p99_ms,
            "all_meet_goals": self.all_meet_goals,
            "check_rps": self.check_rps,
            "check_met": self.check_met,
            "check": _measurement_dict(self.check),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ValidationCandidate:
        return cls(
            trial_number=int(d["trial_number"]),
            config=_knobs(d["config"]),
            search_throughput_rps=float(d.get("search_throughput_rps") or 0.0),
            throughput_rps=tuple(float(x) for x in d.get("throughput_rps") or ()),
            p99_ms=tuple(float(x) for x in d.get("p99_ms") or ()),
            meets_goals=tuple(bool(x) for x in d.get("meets_goals") or ()),
            worst_rps=float(d.get("worst_rps") or 0.0),
            worst_p99_ms=_opt_float(d.get("worst_p99_ms")),
            all_meet_goals=bool(d.get("all_meet_goals", False)),
            p99_n=tuple(_opt_int(x) for x in d.get("p99_n") or ()),
            measurements=tuple(measurement_from_dict(m) for m in d.get("measurements") or ()),
            check_rps=_opt_float(d.get("check_rps")),
            check_met=None if d.get("check_met") is None else bool(d["check_met"]),
            check=measurement_from_dict(d.get("check")),
        )


@dataclass(frozen=True)
class Validation:
    """validation.json: the candidates the sweep re-measured (empty: nothing validated)."""

    candidates: tuple[ValidationCandidate, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            **header(VALIDATION_KIND),
            "candidates": [c.to_dict() for c in self.candidates],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Validation:
        def parse() -> Validation:
            d = _migrate(VALIDATION_KIND, data)
            return cls(tuple(ValidationCandidate.from_dict(c) for c in d.get("candidates") or ()))

        return _parsing(VALIDATION_KIND, parse)


# --------------------------------------------------------------------------------------------------
# Summary


@dataclass(frozen=True)
class ConfigEntry:
    """summary.json's ``baseline`` or ``best``: the config and its headline numbers.

    The numbers are the worst validation repeat when the config was validated (``source``
    ``validation``), else its search measurement.
    """

    config: Knobs
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    meets_goals: bool
    trial_number: int
    #: Relative to the run directory.
    config_path: str | None = None
    p99_n: int | None = None
    p99_low_sample: bool | None = None
    p99_note: str | None = None
    #: :data:`GPU_FIGURE_KEYS` per GPU at the operating point (None: no GPU metric).
    gpus: tuple[dict[str, Any], ...] | None = None
    #: ``best`` only: the worst validated capacity (None: not validated).
    validated_throughput_rps: float | None = None
    #: The search measurement's throughput (the headline may be a validation repeat's).
    search_throughput_rps: float | None = None
    source: str | None = None

    @classmethod
    def from_trial(
        cls,
        trial: TrialRecord,
        *,
        config_path: str | None,
        search_throughput_rps: float | None,
        validated_throughput_rps: float | None = None,
    ) -> ConfigEntry:
        """The entry of a headline trial (``sweep._finish``).

        ``p99_n`` is the number of latencies behind the percentiles; a p99 of fewer than
        :data:`~analyzer.measure.gain.LOW_SAMPLE_P99` is ``p99_low_sample`` with a ``p99_note``.
        """
        samples = trial.request_count()
        gpus = trial.gpu_figures()
        return cls(
            config=trial.config,
            throughput_rps=float(trial.throughput_rps),
            p50_ms=float(trial.p50_ms),
            p99_ms=float(trial.p99_ms),
            meets_goals=bool(trial.meets_goals),
            trial_number=trial.number,
            config_path=config_path,
            p99_n=samples,
            p99_low_sample=None if samples is None else samples < LOW_SAMPLE_P99,
            p99_note=p99_sample_note(samples),
            gpus=None if gpus is None else tuple(gpus),
            validated_throughput_rps=validated_throughput_rps,
            search_throughput_rps=search_throughput_rps,
            source=trial.source,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "throughput_rps": self.throughput_rps,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "p99_n": self.p99_n,
            "p99_low_sample": self.p99_low_sample,
            "p99_note": self.p99_note,
            "meets_goals": self.meets_goals,
            "trial_number": self.trial_number,
            "gpus": None if self.gpus is None else [dict(g) for g in self.gpus],
            "config_path": self.config_path,
            "validated_throughput_rps": self.validated_throughput_rps,
            "search_throughput_rps": self.search_throughput_rps,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ConfigEntry:
        gpus = d.get("gpus")
        return cls(
            config=_knobs(d["config"]),
            throughput_rps=float(d.get("throughput_rps") or 0.0),
            p50_ms=float(d.get("p50_ms") or 0.0),
            p99_ms=float(d.get("p99_ms") or 0.0),
            meets_goals=bool(d.get("meets_goals", False)),
            trial_number=int(d.get("trial_number", -1)),
            config_path=_opt_str(d.get("config_path")),
            p99_n=_opt_int(d.get("p99_n")),
            p99_low_sample=None if d.get("p99_low_sample") is None else bool(d["p99_low_sample"]),
            p99_note=_opt_str(d.get("p99_note")),
            gpus=None if gpus is None else tuple(dict(g) for g in gpus),
            validated_throughput_rps=_opt_float(d.get("validated_throughput_rps")),
            search_throughput_rps=_opt_float(d.get("search_throughput_rps")),
            source=_opt_str(d.get("source")),
        )


def server_gpus(*entries: ConfigEntry | None) -> list[dict[str, Any]]:
    """summary.json's ``server_gpus``: the GPUs the server reported in the entries (uuid, name,
    memory_total_mb), once each."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in entries:
        for g in (entry.gpus if entry is not None else None) or ():
            seen.setdefault(
                g["uuid"],
                {
                    "uuid": g["uuid"],
                    "name": g.get("name"),
                    "memory_total_mb": g.get("memory_total_mb"),
                },
            )
    return list(seen.values())


@dataclass(frozen=True)
class ParetoEntry:
    """One config on the front (objective ``pareto``), ranked by throughput."""

    rank: int
    trial_number: int
    config: Knobs
    throughput_rps: float
    p99_ms: float
    reference_p99_ms: float | None
    config_path: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "trial_number": self.trial_number,
            "config": self.config.to_dict(),
            "throughput_rps": self.throughput_rps,
            "p99_ms": self.p99_ms,
            "reference_p99_ms": self.reference_p99_ms,
            "config_path": self.config_path,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParetoEntry:
        return cls(
            rank=int(d["rank"]),
            trial_number=int(d["trial_number"]),
            config=_knobs(d["config"]),
            throughput_rps=float(d["throughput_rps"]),
            p99_ms=float(d["p99_ms"]),
            reference_p99_ms=_opt_float(d.get("reference_p99_ms")),
            config_path=_opt_str(d.get("config_path")),
        )


@dataclass(frozen=True)
class RunSummary:
    """summary.json: what a sweep produced, where, and in which environment.

    Build it with keyword arguments (``sweep._finish``: :meth:`ConfigEntry.from_trial` for the
    two entries, :meth:`ValidationCandidate.from_dict` for the candidates it wrote), or from the
    JSON with :meth:`from_dict`. Free-form parts (goals, environment, scenario, study, files,
    left_on_server, devices, server_gpus) stay mappings: they are the scenario's and the
    target's own dicts, shown, not computed with.
    """

    run_id: str
    model: str
    device: str
    objective: str
    #: ``scenario.goals`` as a dict (``p99_ms``, ``min_throughput_rps``, ``max_error_rate``, ...).
    goals: dict[str, Any]
    baseline: ConfigEntry | None
    best: ConfigEntry | None
    #: Best over baseline (latency: baseline p99 over best p99); None when not stated.
    gain: float | None
    #: Trial counts by state, and ``total``.
    trials: dict[str, int]
    stop_reason: StopReason
    target_url: str | None = None
    device_requested: str | None = None
    devices: tuple[dict[str, Any], ...] = ()
    server_gpus: tuple[dict[str, Any], ...] = ()
    #: The gain's 95 % interval (low, high); None at an open end (a censored side: one-sided).
    gain_ci: tuple[float | None, float | None] | None = None
    gain_significant: bool | None = None
    #: Repeats behind (best, baseline).
    gain_repeats: tuple[int, ...] | None = None
    gain_text: str | None = None
    goal_text: str | None = None
    tie_break: str | None = None
    left_on_server: dict[str, Any] | None = None
    pareto: tuple[ParetoEntry, ...] = ()
    validation: tuple[ValidationCandidate, ...] = ()
    environment: dict[str, Any] = field(default_factory=dict)
    scenario: dict[str, Any] = field(default_factory=dict)
    study: dict[str, Any] = field(default_factory=dict)
    files: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    #: ``predict``, ``tpe``, ``random`` or ``grid``: the search that ran (None: not recorded).
    search_strategy: str | None = None
    #: Why the search that ran is not the one asked for (e.g. predict fell back to tpe).
    search_note: str | None = None
    #: Seconds per phase (``baseline``, ``profile``, ``predict``, ``search``, ``validation``);
    #: a phase that did not run is absent; empty: not recorded.
    phases: dict[str, float] = field(default_factory=dict)
    #: What best/config.pbtxt holds (``sweep._recommend``, the one rule): ``{"config": "best" |
    #: "original" | null, "detail": "...", "candidate_config": path of a winner not
    #: recommended (its gain is not significant) | null}``; None: not recorded.
    recommendation: dict[str, Any] | None = None
    #: What happened to the server under test during the run: each death (``died``), each
    #: config that killed it twice (``crashed the server``), with the trial and the time.
    server_events: tuple[dict[str, Any], ...] = ()
    #: Restarts of a managed server during the run.
    server_restarts: int = 0
    #: A ``--url`` server's outages: when, seconds waited, whether it returned.
    outages: tuple[dict[str, Any], ...] = ()

    @property
    def chosen(self) -> ConfigEntry | None:
        """The config a user would deploy: ``best``, else the baseline (nothing met the goals)."""
        return self.best or self.baseline

    def candidate(self, trial_number: int) -> ValidationCandidate | None:
        """The validation candidate of a trial (None: it was not validated)."""
        return next((c for c in self.validation if c.trial_number == trial_number), None)

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON, version header first, keys in the documented order."""
        return {
            **header(SUMMARY_KIND),
            "run_id": self.run_id,
            "model": self.model,
            "device": self.device,
            "device_requested": self.device_requested,
            "devices": [dict(d) for d in self.devices],
            "server_gpus": [dict(g) for g in self.server_gpus],
            "target_url": self.target_url,
            "goals": dict(self.goals),
            "objective": self.objective,
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "best": self.best.to_dict() if self.best else None,
            "gain": self.gain,
            "gain_ci": None if self.gain_ci is None else list(self.gain_ci),
            "gain_significant": self.gain_significant,
            "gain_repeats": None if self.gain_repeats is None else list(self.gain_repeats),
            "gain_text": self.gain_text,
            "goal_text": self.goal_text,
            "tie_break": self.tie_break,
            "trials": dict(self.trials),
            "stop_reason": StopReason(self.stop_reason).value,
            "left_on_server": None if self.left_on_server is None else dict(self.left_on_server),
            "pareto": [p.to_dict() for p in self.pareto],
            "validation": [c.to_dict() for c in self.validation],
            "environment": dict(self.environment),
            "scenario": dict(self.scenario),
            "study": dict(self.study),
            "files": dict(self.files),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_s": self.duration_s,
            "search_strategy": self.search_strategy,
            "search_note": self.search_note,
            "phases": dict(self.phases),
            "recommendation": None if self.recommendation is None else dict(self.recommendation),
            "server_events": [dict(e) for e in self.server_events],
            "server_restarts": self.server_restarts,
            "outages": [dict(o) for o in self.outages],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSummary:
        """Inverse of :meth:`to_dict`; reads every version in the format history."""
        return _parsing(SUMMARY_KIND, lambda: cls._from_dict(_migrate(SUMMARY_KIND, data)))

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> RunSummary:
        ci = d.get("gain_ci")
        repeats = d.get("gain_repeats")
        significant = d.get("gain_significant")
        left = d.get("left_on_server")
        duration = d.get("duration_s")
        return cls(
            run_id=str(d["run_id"]),
            model=str(d["model"]),
            device=str(d.get("device", "")),
            objective=str(d.get("objective", "throughput")),
            goals=dict(d.get("goals") or {}),
            baseline=ConfigEntry.from_dict(d["baseline"]) if d.get("baseline") else None,
            best=ConfigEntry.from_dict(d["best"]) if d.get("best") else None,
            gain=_opt_float(d.get("gain")),
            trials={str(k): int(v) for k, v in (d.get("trials") or {}).items()},
            stop_reason=StopReason(str(d.get("stop_reason", ""))),
            target_url=_opt_str(d.get("target_url")),
            device_requested=_opt_str(d.get("device_requested")),
            devices=tuple(dict(x) for x in d.get("devices") or ()),
            server_gpus=tuple(dict(x) for x in d.get("server_gpus") or ()),
            gain_ci=(_opt_float(ci[0]), _opt_float(ci[1]))
            if isinstance(ci, list) and len(ci) == 2
            else None,
            gain_significant=None if significant is None else bool(significant),
            gain_repeats=None if repeats is None else tuple(int(r) for r in repeats),
            gain_text=_opt_str(d.get("gain_text")),
            goal_text=_opt_str(d.get("goal_text")),
            tie_break=_opt_str(d.get("tie_break")),
            left_on_server=None if left is None else dict(left),
            pareto=tuple(ParetoEntry.from_dict(p) for p in d.get("pareto") or ()),
            validation=tuple(ValidationCandidate.from_dict(c) for c in d.get("validation") or ()),
            environment=dict(d.get("environment") or {}),
            scenario=dict(d.get("scenario") or {}),
            study=dict(d.get("study") or {}),
            files=dict(d.get("files") or {}),
            started_at=_opt_str(d.get("started_at")),
            finished_at=_opt_str(d.get("finished_at")),
            duration_s=None if duration is None else float(duration),
            search_strategy=_opt_str(d.get("search_strategy")),
            search_note=_opt_str(d.get("search_note")),
            phases={str(k): float(v) for k, v in (d.get("phases") or {}).items()},
            recommendation=dict(d["recommendation"]) if d.get("recommendation") else None,
            server_events=tuple(dict(e) for e in d.get("server_events") or ()),
            server_restarts=int(d.get("server_restarts") or 0),
            outages=tuple(dict(o) for o in d.get("outages") or ()),
        )


# --------------------------------------------------------------------------------------------------
# Versions


def _migrate(kind: str, data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``data`` lifted to the current version of ``kind`` (a dict without header: current).

    Raises:
        ResultFormatError: A version newer than this perfsweep's, or one it has no path from.
    """
    if "format_version" not in data:  # from_dict takes header-less dicts: the current version
        return data
    return FORMATS[kind].lift(data, data.get("kind", kind))


def _parsing(kind: str, parse: Callable[[], Any]) -> Any:
    """Run ``parse``; a missing key or a value of the wrong type is a damaged ``kind`` file."""
    try:
        return parse()
    except ResultFormatError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ResultFormatError(
            f"a {kind} record is damaged ({what}); re-run the sweep, or use the perfsweep "
            "version that wrote it"
        ) from exc


# --------------------------------------------------------------------------------------------------
# Files


def _load(path: Path, kind: str, parse: Callable[[Mapping[str, Any]], Any]) -> Any:
    data = read_document(path, kind)
    if "format_version" not in data:  # from_dict takes header-less dicts; a file has a header
        refuse_version(path, None, FORMATS[kind].current)
    try:
        return parse(data)
    except ResultFormatError as exc:
        raise ResultFormatError(f"{path}: {exc}") from exc


def summary_path(path: Path) -> Path:
    """summary.json of a run directory, or ``path`` itself when it is a file."""
    path = Path(path)
    return path / "summary.json" if path.is_dir() else path


def load_summary(path: Path) -> RunSummary:
    """Read summary.json (a run directory or the file itself).

    Raises:
        ResultFormatError: Missing, damaged, another kind, or a version this perfsweep cannot read.
    """
    result: RunSummary = _load(summary_path(path), SUMMARY_KIND, RunSummary.from_dict)
    return result


def load_trial(path: Path) -> TrialRecord:
    """Read a ``trials/NNN/measurement.json`` (or ``baseline/measurement.json``)."""
    result: TrialRecord = _load(Path(path), TRIAL_KIND, TrialRecord.from_dict)
    return result


def load_validation(path: Path) -> Validation:
    """Read validation.json."""
    result: Validation = _load(Path(path), VALIDATION_KIND, Validation.from_dict)
    return result


def load_predictions(path: Path) -> Predictions:
    """Read predictions.json (a run directory or the file itself).

    Raises:
        ResultFormatError: Missing, damaged, another kind, or a version this perfsweep cannot read.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "predictions.json"
    result: Predictions = _load(path, PREDICTIONS_KIND, Predictions.from_dict)
    return result


def write_predictions(path: Path, predictions: Predictions) -> None:
    """Atomically write predictions.json."""
    write_json(Path(path), predictions.to_dict())


def write_summary(path: Path, summary: RunSummary) -> None:
    """Atomically write summary.json."""
    write_json(Path(path), summary.to_dict())


def write_trial(path: Path, record: TrialRecord) -> None:
    """Atomically write a trial record."""
    write_json(Path(path), record.to_dict())


def write_validation(path: Path, validation: Validation) -> None:
    """Atomically write validation.json."""
    write_json(Path(path), validation.to_dict())
