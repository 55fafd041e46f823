"""The seam between the measurement engine and its users, and the document it writes.

:class:`LoadGenerator` (``analyzer.load.LocustLoadGenerator`` is the real one; tests use a
fake), and the versioned ``perfsweep load --output`` document: :func:`load_output_dict`
writes it, :func:`read_load_output` reads it back and refuses versions it cannot read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from analyzer.documents import FORMATS, LOAD_KIND, header
from analyzer.errors import ResultFormatError
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import CapacitySpec, LoadSpec


def load_output_dict(
    measurements: Sequence[Measurement],
    capacity: CapacityResult | None = None,
    environment: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The versioned document ``perfsweep load --output`` writes."""
    doc: dict[str, Any] = {
        **header(LOAD_KIND),
        "environment": dict(environment or {}),
        "results": [m.to_dict() for m in measurements],
    }
    if capacity is not None:
        doc["capacity_rps"] = capacity.capacity_rps
        doc["capacity"] = capacity.to_dict()
    return doc


def read_load_output(doc: Mapping[str, Any]) -> tuple[list[Measurement], CapacityResult | None]:
    """Parse a ``perfsweep load --output`` document; refuse versions this build cannot read."""
    version, fmt = doc.get("format_version"), FORMATS[LOAD_KIND]
    if doc.get("kind") != LOAD_KIND or not fmt.readable(version):
        raise ResultFormatError(
            f"not a perfsweep load result of format {fmt.current} "
            f"(kind={doc.get('kind')!r}, format_version={version!r}); "
            "re-run `perfsweep load` with this version or use the perfsweep that wrote it"
        )
    doc = fmt.lift(doc, LOAD_KIND)
    measurements = [Measurement.from_dict(m) for m in doc["results"]]
    capacity = CapacityResult.from_dict(doc["capacity"]) if doc.get("capacity") else None
    return measurements, capacity


class LoadGenerator(Protocol):
    """The seam between the measurement engine and its users (sweep, CLI).

    ``analyzer.load.LocustLoadGenerator`` is the real one; tests of search/report/gate logic use
    a fake that computes results from a formula.
    """

    def measure(self, spec: LoadSpec) -> Measurement:
        """Measure one load level."""
        ...

    def find_capacity(self, spec: CapacitySpec) -> CapacityResult:
        """Find the highest open-loop request rate that meets ``spec.goals``."""
        ...
