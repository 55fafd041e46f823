"""Prediction against measurement, the predicted landscape and the phase times, as data.

The run directory is a real planted sweep; its predictions are then planted with the records'
own writers (``write_trial``, ``write_predictions``, ``write_summary``): each trial's prediction
is its measured capacity times a known factor, and predictions.json holds every config of the
space at a known formula, so every number the report shows has a known answer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import statistics
from pathlib import Path

import pytest

from analyzer.config.knobs import Knobs
from analyzer.config.scenario import load_scenario
from analyzer.report import build_record, load_run, write_compare_report, write_report
from analyzer.report.prediction import NOT_A_CAPACITY
from analyzer.rundir.measurements import CapacityMeasurement
from analyzer.rundir.predictions import ConfigPrediction, Prediction, Predictions
from analyzer.rundir.records import (
    load_summary,
    load_trial,
    write_predictions,
    write_summary,
    write_trial,
)
from analyzer.rundir.results import RunDirectory
from analyzer.sweep.loop import space_for
from tests.report.conftest import HOSTILE, sweep_run_dir
from tests.report.test_html import assert_no_external_urls, embedded, parse

#: Trial number -> predicted / measured (the baseline, -1, keeps no prediction of its own).
FACTORS = {0: 1.05, 1: 0.92, 2: 1.30, 3: 1.0, 4: 0.97, 5: 1.08, 6: 0.85, 7: 1.02}
#: Each trial's planted band: +-12 % around its prediction.
BAND = 0.12
PHASES = {"search": 40.0, "baseline": 10.0, "validation": 25.0, "profile": 5.0, "predict": 20.0}
#: Two run directories written in format version 1, without predictions or phase times.
EXAMPLES = Path(__file__).resolve().parents[2] / "tests" / "data" / "format-1-runs"


def planted_capacity(k: Knobs) -> float:
    """predictions.json's planted capacity: more instances, bigger batches, longer preferred
    lists and shorter delays predict more (so each cell's best is its longest preferred list)."""
    return (
        100.0 * k.instance_count
        + 10.0 * math.log2(k.max_batch_size)
        + 5.0 * len(k.preferred_batch_size)
        - k.max_queue_delay_us / 100.0
    )


def _band(capacity: float, width: float = BAND) -> Prediction:
    return Prediction(capacity, capacity * (1 - width), capacity * (1 + width))


def plant_predictions(run: Path, *, trials: bool = True, space: bool = True) -> None:
    """Write predictions into a finished run directory with the records' writers."""
    directory = RunDirectory(run)
    if trials:
        for path in directory.trial_paths():
            record = load_trial(path)
            capacity = record.measurement.capacity if record.measurement is not None else None
            if record.number not in FACTORS or not record.complete or capacity is None:
                continue
            predicted = _band(capacity.capacity_rps * FACTORS[record.number])
            write_trial(path, dataclasses.replace(record, prediction=predicted))
    if space:
        scenario = load_scenario(run / "scenario.toml", env={})
        configs = []
        for params in space_for(scenario).points():
            knobs = space_for(scenario).decode(params)
            configs.append(ConfigPrediction(knobs, _band(planted_capacity(knobs), 0.1)))
        profile = {"source": "planted", "batch_sizes": [1, 32]}
        write_predictions(directory.predictions_json, Predictions(profile, tuple(configs)))
    summary = load_summary(directory.summary_json)
    write_summary(
        directory.summary_json,
        dataclasses.replace(summary, phases=dict(PHASES), search_strategy="predict"),
    )


@pytest.fixture(scope="module")
def predicted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("predicted") / "predicted-run"
    sweep_run_dir(root, trials=8)
    plant_predictions(root)
    return root


@pytest.fixture(scope="module")
def record(predicted_run: Path):
    return build_record(load_run(predicted_run, importances=False))


def _measured(run: Path) -> dict[int, tuple[float, bool]]:
    """Trial number -> the capacity its search measured and whether it was bracketed."""
    out = {}
    for path in RunDirectory(run).trial_paths():
        r = load_trial(path)
        if r.complete and r.measurement is not None and r.measurement.capacity is not None:
            capacity = r.measurement.capacity
            out[r.number] = (capacity.capacity_rps, capacity.bracketed)
    return out


def test_every_measured_config_is_set_against_its_prediction(predicted_run: Path, record) -> None:
    measured = _measured(predicted_run)
    check = record.prediction
    assert check is not None and "prediction" not in record.missing
    # Each complete trial's own prediction; the baseline, outside the space, has none.
    expected = {n for n in measured if n in FACTORS}
    assert {p.trial_number for p in check.points} == expected
    for p in check.points:
        capacity, bracketed = measured[p.trial_number]
        assert p.source == "trial record"
        assert p.measured_rps == pytest.approx(capacity)
        assert p.bracketed == (bracketed and capacity > 0)
        assert p.predicted_rps == pytest.approx(capacity * FACTORS[p.trial_number])
        assert p.low_rps == pytest.approx(p.predicted_rps * (1 - BAND))
        assert p.high_rps == pytest.approx(p.predicted_rps * (1 + BAND))
        if capacity > 0:
            assert p.relative_error == pytest.approx(FACTORS[p.trial_number] - 1, abs=1e-6)
    errors = {p.trial_number: abs(FACTORS[p.trial_number] - 1) for p in check.points if p.bracketed}
    assert len(errors) >= 4  # the planted search brackets most capacities
    assert check.unmeasured + check.lower_bounds == len(check.points) - len(errors)
    assert check.median_abs_error == pytest.approx(statistics.median(errors.values()), abs=1e-6)
    worst = max(errors, key=lambda n: errors[n])
    assert check.worst_trial_number == worst
    assert check.worst_abs_error == pytest.approx(errors[worst], abs=1e-6)
    assert check.within_10pct == sum(e <= 0.10 for e in errors.values())
    # Inside its band: predicted x (1 - 12 %) <= measured <= predicted x (1 + 12 %).
    assert check.in_band == sum(
        FACTORS[p.trial_number] * (1 - BAND) <= 1 <= FACTORS[p.trial_number] * (1 + BAND)
        for p in check.points
        if p.measured_rps > 0
    )
    outside = {p.trial_number for p in check.points if p.bracketed and not p.in_band}
    assert outside == {2, 6} & set(errors)  # factors 1.30 and 0.85 miss a +-12 % band
    assert f"median {100 * statistics.median(errors.values()):.1f} %" in check.summary
    assert f"worst {100 * errors[worst]:.1f} % (trial {worst})" in check.summary


def test_a_capacity_at_the_rate_ceiling_is_a_lower_bound_not_an_error(
    predicted_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(predicted_run, run)
    worst = build_record(load_run(run, importances=False)).prediction.worst_trial_number
    path = next(p for p in RunDirectory(run).trial_paths() if load_trial(p).number == worst)
    trial = load_trial(path)
    assert isinstance(trial.measurement, CapacityMeasurement)
    unbracketed = dataclasses.replace(trial.measurement.result, bracketed=False)
    write_trial(path, dataclasses.replace(trial, measurement=CapacityMeasurement(unbracketed)))
    check = build_record(load_run(run, importances=False)).prediction
    assert check is not None and check.lower_bounds == 1
    point = next(p for p in check.points if p.trial_number == worst)
    assert not point.bracketed and point.relative_error is not None
    assert check.worst_trial_number != worst  # no longer in the error figures
    assert "1 met the goals up to the highest rate tried" in check.summary


def test_a_trial_without_its_own_prediction_takes_the_space_wide_one(
    predicted_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(predicted_run, run)
    path = RunDirectory(run).trial_paths()[1]  # trial 0
    trial = load_trial(path)
    write_trial(path, dataclasses.replace(trial, prediction=None))
    check = build_record(load_run(run, importances=False)).prediction
    assert check is not None
    point = next(p for p in check.points if p.trial_number == trial.number)
    assert point.source == "predictions.json"
    assert point.predicted_rps == pytest.approx(planted_capacity(trial.config))
    assert point.low_rps == pytest.approx(planted_capacity(trial.config) * 0.9)


def test_landscape_collapses_preferred_sizes_to_the_best_per_cell(
    predicted_run: Path, record
) -> None:
    space = record.landscape
    assert space is not None and "landscape" not in record.missing
    predictions = json.loads((predicted_run / "predictions.json").read_text())["configs"]
    assert space.configs == len(predictions)
    best_per_cell: dict[tuple[int, int, int], tuple[float, list[int], int]] = {}
    for entry in predictions:
        c = entry["config"]
        key = (c["instance_count"], c["max_batch_size"], c["max_queue_delay_us"])
        held = best_per_cell.get(key)
        count = 1 + (held[2] if held else 0)
        if held is None or entry["capacity_rps"] > held[0]:
            held = (entry["capacity_rps"], c["preferred_batch_size"], count)
        best_per_cell[key] = (held[0], held[1], count)
    cells = {(c.instance_count, c.max_batch_size, c.max_queue_delay_us): c for c in space.cells}
    assert set(cells) == set(best_per_cell)
    for key, (capacity, preferred, count) in best_per_cell.items():
        assert cells[key].capacity_rps == pytest.approx(capacity)
        assert list(cells[key].preferred_batch_size) == preferred
        assert cells[key].configs == count
    assert space.instance_counts == (1, 2, 3)
    assert space.max_batch_sizes == (1, 2, 4, 8, 16, 32)
    top = max(best_per_cell, key=lambda k: best_per_cell[k][0])
    assert (space.best.instance_count, space.best.max_batch_size) == top[:2]
    assert space.best.max_queue_delay_us == top[2]
    assert any("Preferred sizes collapsed" in n for n in space.notes)
    assert space.profile == {"source": "planted", "batch_sizes": [1, 32]}
    # Every complete measured config of the space is marked in its cell, the best as "best".
    complete = {t.number: t for t in record.trials if t.state == "complete"}
    marked = {m.trial_number: m for m in space.marks}
    for number, m in marked.items():
        t = complete[number]
        assert (m.instance_count, m.max_batch_size, m.max_queue_delay_us) in cells
        assert m.max_batch_size == t.config["max_batch_size"]
        assert m.measured_rps == t.throughput_rps and m.meets_goals == t.meets_goals
    assert {n for n in complete if n >= 0} <= set(marked)
    assert marked[record.verdict.best.trial_number].role == "best"


def test_phases_in_run_order_and_the_strategy_in_the_verdict(record) -> None:
    phases = record.phases
    assert phases is not None and "phases" not in record.missing
    assert [p.name for p in phases.phases] == [
        "baseline",
        "profile",
        "predict",
        "search",
        "validation",
    ]
    total = sum(PHASES.values())
    assert phases.total_s == pytest.approx(total)
    for p in phases.phases:
        assert p.seconds == pytest.approx(PHASES[p.name])
        assert p.share == pytest.approx(PHASES[p.name] / total, abs=1e-4)
    assert record.verdict.search_strategy == "predict"


def test_page_shows_the_prediction_the_landscape_and_the_phases(
    predicted_run: Path, tmp_path: Path
) -> None:
    out = write_report(predicted_run, tmp_path / "report.html")
    _, parser = parse(out)
    data = embedded(parser)
    expected = build_record(load_run(predicted_run)).to_dict()
    assert data == json.loads(json.dumps(expected))
    shown = {a.get("data-figure") for tag, a in parser.tags if tag == "figure"}
    assert {"predicted_vs_measured", "landscape"} <= shown
    figure = next(
        a for tag, a in parser.tags if tag == "figure" and a.get("data-figure") == "landscape"
    )
    assert f"{data['landscape']['configs']} configs" in (figure.get("aria-label") or "")
    caption = parser.text_by_id["prediction"]
    assert data["prediction"]["summary"] in caption
    assert "Preferred sizes collapsed" in parser.text_by_id["landscape-notes"]
    table = parser.text_by_id["phases-table"]
    for name in PHASES:
        assert name in table
    assert f"{sum(PHASES.values()):.1f}" in table
    assert parser.text_by_id["search-strategy"].startswith("predict")
    # The trials table says what was predicted for each trial, so the scatter's points are named.
    trials_table = parser.text_by_id["trials-table"]
    assert "predicted" in trials_table
    for p in data["prediction"]["points"]:
        assert f"{p['predicted_rps']:.1f}" in trials_table
    ids = [a["id"] for _, a in parser.tags if a.get("id")]
    assert len(ids) == len(set(ids))  # the new figures' SVG ids are prefixed too
    assert_no_external_urls(parser)


@pytest.mark.usefixtures("takes_seconds")
def test_example_runs_without_predictions_still_render(tmp_path: Path) -> None:
    examples = sorted(p for p in EXAMPLES.iterdir() if (p / "summary.json").exists())
    assert examples
    for example in examples:
        out = write_report(example, tmp_path / f"{example.name}.html")
        _, parser = parse(out)
        data = embedded(parser)
        assert data["prediction"] is None and data["landscape"] is None
        assert data["phases"] is None
        assert "--search predict" in data["missing"]["prediction"]
        assert "no predictions.json" in data["missing"]["landscape"]
        assert "phase times" in data["missing"]["phases"]
        missing = {a.get("data-missing") for _, a in parser.tags if a.get("data-missing")}
        assert {"prediction", "landscape", "phases"} <= missing
        shown = {a.get("data-figure") for tag, a in parser.tags if tag == "figure"}
        assert not shown & {"predicted_vs_measured", "landscape"}
        assert "predicted" not in parser.text_by_id["trials-table"]


def test_compare_is_unaffected_by_predictions(
    predicted_run: Path, planted_run: Path, tmp_path: Path
) -> None:
    out = write_compare_report(predicted_run, planted_run, tmp_path / "compare.html")
    _, parser = parse(out)
    assert {a.get("data-figure") for tag, a in parser.tags if tag == "figure"} == {
        "compare_tradeoff",
        "compare_curves",
    }
    assert embedded(parser)["a"]["landscape"] is not None


def test_a_one_cell_space_with_nothing_passing_still_draws(
    predicted_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(predicted_run, run)
    only = Knobs(max_batch_size=8, max_queue_delay_us=0, instance_count=1)
    profile = {"source": "planted", "note": HOSTILE}
    write_predictions(
        RunDirectory(run).predictions_json,
        Predictions(profile, (ConfigPrediction(only, Prediction(0.0, 0.0, 0.0)),)),
    )
    for path in RunDirectory(run).trial_paths():
        write_trial(path, dataclasses.replace(load_trial(path), prediction=Prediction(0, 0, 0)))
    out = write_report(run, tmp_path / "report.html")
    text, parser = parse(out)
    data = embedded(parser)
    assert [c["capacity_rps"] for c in data["landscape"]["cells"]] == [0.0]
    assert data["landscape"]["instance_counts"] == [1]
    shown = {a.get("data-figure") for tag, a in parser.tags if tag == "figure"}
    assert {"predicted_vs_measured", "landscape"} <= shown
    # The profile is shown as text, escaped like every other run string.
    assert HOSTILE not in text and HOSTILE in parser.text_by_id["landscape-profile"]


@pytest.mark.usefixtures("takes_seconds")
def test_latency_objective_has_no_capacity_to_check(tmp_path: Path) -> None:
    run = tmp_path / "latency"
    sweep_run_dir(run, trials=3, objective="latency")
    plant_predictions(run, trials=False)
    record = build_record(load_run(run, importances=False))
    assert record.prediction is None
    assert record.missing["prediction"] == NOT_A_CAPACITY
    assert record.landscape is not None  # the predicted space is still drawn


def test_a_damaged_predictions_file_is_named_not_fatal(predicted_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(predicted_run, run)
    (run / "predictions.json").write_text('{"kind": "perfsweep.predictions", "format_version": 9}')
    record = build_record(load_run(run, importances=False))
    assert record.landscape is None
    assert "predictions.json is not readable" in record.missing["landscape"]
    # The trials' own predictions are still set against their measurements.
    assert record.prediction is not None
    assert all(p.source == "trial record" for p in record.prediction.points)
