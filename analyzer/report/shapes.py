"""A run whose ``traffic.arrival`` lists several shapes: each shape's pick beside the worst-case
pick (:class:`~analyzer.report.record.ShapeTable`), each with its capacity under every shape.

The sweep ranks configs by their worst capacity; this table shows what that choice costs or
saves against tuning for one shape alone (say Poisson, when production is bursty). Every figure
is the search trial's own measurement of the config (each config once, not validated).
"""

from __future__ import annotations

from collections.abc import Iterable

from analyzer.report.record import ShapePick, ShapeTable
from analyzer.rundir.measurements import ShapesMeasurement
from analyzer.rundir.trial_record import TrialRecord

#: The row of the config that serves the most in the worst case (the run's own ranking).
WORST_CASE = "worst case"


def shape_table(records: Iterable[TrialRecord], label: dict[int, str]) -> ShapeTable | None:
    """The picks among the feasible search trials measured under several shapes; None when
    there are none (a run with one shape)."""
    measured = [
        (r, r.measurement.capacities())
        for r in records
        if r.number >= 0 and r.feasible and isinstance(r.measurement, ShapesMeasurement)
    ]
    if not measured:
        return None
    shapes = tuple(measured[0][1])
    picks = []
    for chosen_for in (*shapes, WORST_CASE):

        def served(item: tuple[TrialRecord, dict[str, float]], shape: str = chosen_for) -> float:
            caps = item[1]
            return min(caps.values()) if shape == WORST_CASE else caps.get(shape, 0.0)

        record, caps = max(measured, key=served)  # the first of equals: the earlier trial
        picks.append(
            ShapePick(
                chosen_for,
                record.number,
                label.get(record.number, f"trial {record.number}"),
                tuple(caps.get(s, 0.0) for s in shapes),
            )
        )
    return ShapeTable(shapes, tuple(picks))
