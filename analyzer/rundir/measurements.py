"""A trial's measurement, one of four typed shapes told apart by :attr:`TrialMeasurement.kind`.

::

    CapacityMeasurement  a capacity search (objective ``throughput``)
    FixedMeasurement     one fixed load level (objective ``latency``)
    ParetoMeasurement    a capacity search plus the reference level (objective ``pareto``)
    ShapesMeasurement    a capacity search per arrival shape (``traffic.arrival`` lists
                         several): the config stands for its worst
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from analyzer.errors import ResultFormatError
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.goals import unusable
from analyzer.measure.measurement import GpuStats, Measurement, gentlest
from analyzer.rundir.parsing import GPU_FIGURE_KEYS


class MeasurementKind(str, enum.Enum):
    """Which of the three shapes a trial's measurement has."""

    CAPACITY = "capacity"
    FIXED = "fixed"
    PARETO = "pareto"
    SHAPES = "shapes"


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
        search's best point, else its gentlest point (:func:`analyzer.measure.measurement.gentlest`,
        the one copy of that rule); None when nothing was measured."""
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


@dataclass(frozen=True)
class ShapesMeasurement(TrialMeasurement):
    """A capacity search under each arrival shape; the trial's capacity is the worst of them.

    Attributes:
        results: ``(shape, search)`` in the scenario's shape order (a shape in its short form,
            ``trace:requests.csv`` for a trace).
    """

    results: tuple[tuple[str, CapacityResult], ...]
    kind: ClassVar[MeasurementKind] = MeasurementKind.SHAPES

    def __post_init__(self) -> None:
        if not self.results:
            raise ValueError("a shapes measurement needs a search")

    @property
    def worst_shape(self) -> str:
        """The shape the config serves least under (the first of equals)."""
        return min(self.results, key=lambda r: r[1].capacity_rps)[0]

    @property
    def capacity(self) -> CapacityResult:
        return dict(self.results)[self.worst_shape]

    @property
    def fixed(self) -> None:
        return None

    def capacities(self) -> dict[str, float]:
        """Shape -> the capacity found under it."""
        return {shape: result.capacity_rps for shape, result in self.results}

    def problem(self) -> str | None:
        for shape, result in self.results:
            if result.best is not None and (problem := unusable(result.best)):
                return f"{shape}: {problem}"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"shapes": [{"arrival": a, **r.to_dict()} for a, r in self.results]}


def measurement_from_dict(raw: Mapping[str, Any] | None) -> TrialMeasurement | None:
    """A trial's ``measurement`` JSON as its typed shape (None when not recorded).

    Version 1 does not name the shape; this is the one place that reads it from the keys.

    Raises:
        ResultFormatError: The JSON has none of the three shapes.
    """
    if not raw:
        return None
    if "shapes" in raw:
        return ShapesMeasurement(
            tuple((r["arrival"], CapacityResult.from_dict(r)) for r in raw["shapes"])
        )
    if "capacity" in raw and "reference" in raw:
        return ParetoMeasurement(
            CapacityResult.from_dict(raw["capacity"]), Measurement.from_dict(raw["reference"])
        )
    if "points" in raw and "capacity_rps" in raw:
        return CapacityMeasurement(CapacityResult.from_dict(raw))
    if "mode" in raw:
        return FixedMeasurement(Measurement.from_dict(raw))
    raise ResultFormatError(
        f"a measurement with keys {sorted(raw)[:6]} is none of capacity, fixed, pareto or shapes"
    )


def measurement_dict(m: TrialMeasurement | None) -> dict[str, Any] | None:
    return None if m is None else m.to_dict()
