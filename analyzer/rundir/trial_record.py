"""One trial's record: ``trials/NNN/measurement.json`` (and ``baseline/``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from analyzer.config.pipeline import TrialKnobs
from analyzer.documents import TRIAL_KIND, header
from analyzer.measure.goals import goals_met
from analyzer.measure.measurement import Measurement
from analyzer.measure.tokens import TokenStats
from analyzer.rundir.measurements import TrialMeasurement, measurement_dict, measurement_from_dict
from analyzer.rundir.parsing import migrate, opt_str, parse_guarded, parse_knobs
from analyzer.rundir.predictions import Prediction, opt_prediction


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
    config: TrialKnobs
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
        """Complete and meeting the goals on a usable measurement
        (``analyzer.measure.goals.goals_met``).

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

    def tokens(self) -> TokenStats | None:
        """The operating point's token figures: a generative model's trial (TTFT, ITL,
        tokens/s, goodput); None for a model answered once per request, or not recorded."""
        point = self.operating_point()
        return point.tokens if point is not None else None

    def token_figures(self) -> dict[str, float | None]:
        """``ttft_p99_ms``, ``itl_p99_ms``, ``output_tokens_per_s``, ``goodput_rps`` of the
        operating point (what a trial line, summary.json and ``best/`` quote); empty without
        token streams."""
        t = self.tokens()
        if t is None:
            return {}
        return {
            "ttft_p99_ms": t.ttft_p99_ms,
            "itl_p99_ms": t.itl_p99_ms,
            "output_tokens_per_s": t.output_tokens_per_s,
            "goodput_rps": t.goodput_rps,
        }

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
            "measurement": measurement_dict(self.measurement),
            "prediction": None if self.prediction is None else self.prediction.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialRecord:
        """Inverse of :meth:`to_dict` (also without the version header)."""
        return parse_guarded(TRIAL_KIND, lambda: cls._from_dict(migrate(TRIAL_KIND, data)))

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> TrialRecord:
        return cls(
            number=int(d["number"]),
            source=str(d["source"]),
            state=str(d["state"]),
            config=parse_knobs(d["config"]),
            throughput_rps=float(d.get("throughput_rps", 0.0)),
            offered_rps=float(d.get("offered_rps", 0.0)),
            p50_ms=float(d.get("p50_ms", 0.0)),
            p90_ms=float(d.get("p90_ms", 0.0)),
            p99_ms=float(d.get("p99_ms", 0.0)),
            error_rate=float(d.get("error_rate", 0.0)),
            meets_goals=bool(d.get("meets_goals", False)),
            constraints={str(k): float(v) for k, v in (d.get("constraints") or {}).items()},
            values=tuple(float(v) for v in d.get("values") or ()),
            failure=opt_str(d.get("failure")),
            started_at=str(d.get("started_at") or ""),
            duration_s=float(d.get("duration_s") or 0.0),
            measurement=measurement_from_dict(d.get("measurement")),
            prediction=opt_prediction(d.get("prediction")),
        )
