"""The report's side-by-side of arrival shapes: each shape's pick and the worst-case pick."""

from __future__ import annotations

from dataclasses import replace

from analyzer.report.shapes import WORST_CASE, shape_table
from analyzer.rundir.measurements import CapacityMeasurement, ShapesMeasurement
from analyzer.rundir.trial_record import TrialRecord
from tests.unit.test_records import capacity, level, trial

BURSTS = "mmpp:20@0.0025,0.2@0.05"


def shaped(number: int, poisson: float, bursts: float) -> TrialRecord:
    m = ShapesMeasurement(
        (
            ("poisson", capacity(level(poisson, 20), level(poisson, 20))),
            (BURSTS, capacity(level(bursts, 20), level(bursts, 20))),
        )
    )
    return replace(trial(number, m), throughput_rps=min(poisson, bursts))


def test_each_shape_has_its_pick_beside_the_worst_case_pick() -> None:
    runs = [shaped(0, 460.0, 30.0), shaped(1, 290.0, 66.0), shaped(2, 100.0, 60.0)]
    table = shape_table(runs, {0: "no delay", 1: "4 ms delay"})
    assert table is not None and table.shapes == ("poisson", BURSTS)
    picks = {p.chosen_for: p for p in table.picks}
    assert (picks["poisson"].trial_number, picks["poisson"].label) == (0, "no delay")
    assert picks["poisson"].capacities == (460.0, 30.0)
    assert picks[BURSTS].trial_number == 1 and picks[WORST_CASE].trial_number == 1
    assert picks[WORST_CASE].label == "4 ms delay"
    assert shape_table(runs[2:], {}) is not None  # an unlabelled trial is named by number


def test_a_run_with_one_shape_has_no_table() -> None:
    plain = trial(0, CapacityMeasurement(capacity(level(200, 30), level(200, 30))))
    assert shape_table([plain], {}) is None
    baseline = replace(shaped(0, 460.0, 30.0), number=-1)  # the baseline is not a pick
    assert shape_table([baseline], {}) is None
