"""``validation.json``: the best configs re-measured before one was chosen."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from analyzer.config.pipeline import TrialKnobs
from analyzer.documents import VALIDATION_KIND, header
from analyzer.rundir.measurements import TrialMeasurement, measurement_dict, measurement_from_dict
from analyzer.rundir.parsing import migrate, opt_float, opt_int, parse_guarded, parse_knobs


@dataclass(frozen=True)
class ValidationCandidate:
    """One config re-measured in validation: every repeat's numbers and their worst case."""

    trial_number: int
    config: TrialKnobs
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
    #: capacity; for a cheaper tie checked alone, that less the capacity search's resolution),
    #: whether the config served it, and the check's measurement. The check is the
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
            "measurements": [measurement_dict(m) for m in self.measurements],
            "worst_rps": self.worst_rps,
            "worst_p99_ms": self.worst_p99_ms,
            "all_meet_goals": self.all_meet_goals,
            "check_rps": self.check_rps,
            "check_met": self.check_met,
            "check": measurement_dict(self.check),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ValidationCandidate:
        return cls(
            trial_number=int(d["trial_number"]),
            config=parse_knobs(d["config"]),
            search_throughput_rps=float(d.get("search_throughput_rps") or 0.0),
            throughput_rps=tuple(float(x) for x in d.get("throughput_rps") or ()),
            p99_ms=tuple(float(x) for x in d.get("p99_ms") or ()),
            meets_goals=tuple(bool(x) for x in d.get("meets_goals") or ()),
            worst_rps=float(d.get("worst_rps") or 0.0),
            worst_p99_ms=opt_float(d.get("worst_p99_ms")),
            all_meet_goals=bool(d.get("all_meet_goals", False)),
            p99_n=tuple(opt_int(x) for x in d.get("p99_n") or ()),
            measurements=tuple(measurement_from_dict(m) for m in d.get("measurements") or ()),
            check_rps=opt_float(d.get("check_rps")),
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
            d = migrate(VALIDATION_KIND, data)
            return cls(tuple(ValidationCandidate.from_dict(c) for c in d.get("candidates") or ()))

        return parse_guarded(VALIDATION_KIND, parse)
