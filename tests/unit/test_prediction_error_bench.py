"""benchmarks/prediction_error.py: predicted vs measured capacities, the first config the
calibration's."""

from __future__ import annotations

import pytest

from benchmarks.prediction_error import score, table


class _Sim:
    def __init__(self, text: str) -> None:
        self.text = text

    def describe(self) -> str:
        return self.text


def test_the_first_config_is_reported_and_not_counted() -> None:
    rows = [
        {"config": "as found", "sim": {"a": _Sim("x1")}, "measured_rps": 100.0},
        {"config": "b", "sim": {"a": _Sim("x2")}, "measured_rps": 200.0},
        {"config": "c", "sim": {"a": _Sim("x3")}, "measured_rps": 0.0},
        {"config": "d", "sim": {"a": _Sim("x4")}, "measured_rps": 100.0},
    ]
    predicted = {"x1": 150.0, "x2": 180.0, "x3": 50.0, "x4": 130.0}
    result = score(rows, lambda sims: predicted[sims["a"].text])
    assert [r["error"] for r in result["configs"]] == [0.5, 0.1, None, 0.3]
    assert result["errors_counted"] == 2
    assert result["median_error"] == pytest.approx(0.2)
    assert result["worst_error"] == 0.3
    assert result["configs"][1]["sim"] == {"a": "x2"}
    text = table({**result, "probe_s": 3.0}, "offsets {} ms")
    assert "as found (offsets fitted here)" in text
    assert "median 20.0 %, worst 30.0 % (offsets {} ms, probe 3.0 s)" in text
