"""``predictions.json``: every config's simulated capacity (``--search predict``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from analyzer.config.pipeline import TrialKnobs, knobs_from_dict
from analyzer.documents import PREDICTIONS_KIND, header
from analyzer.rundir.parsing import migrate, parse_guarded


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


def opt_prediction(raw: Mapping[str, Any] | None) -> Prediction | None:
    return None if not raw else Prediction.from_dict(raw)


@dataclass(frozen=True)
class ConfigPrediction:
    """One config of the space and its :class:`Prediction` (an entry of predictions.json)."""

    config: TrialKnobs
    prediction: Prediction

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), **self.prediction.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ConfigPrediction:
        return cls(knobs_from_dict(d["config"]), Prediction.from_dict(d))


@dataclass(frozen=True)
class Predictions:
    """predictions.json: the simulator's capacity for every config of the space.

    ``profile`` is a short description of the profile the simulator ran on (shown, not computed
    with); ``configs`` are in the space's order.
    """

    profile: dict[str, Any] = field(default_factory=dict)
    configs: tuple[ConfigPrediction, ...] = ()

    def get(self, config: TrialKnobs) -> Prediction | None:
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
            d = migrate(PREDICTIONS_KIND, data)
            return cls(
                dict(d.get("profile") or {}),
                tuple(ConfigPrediction.from_dict(c) for c in d.get("configs") or ()),
            )

        return parse_guarded(PREDICTIONS_KIND, parse)
