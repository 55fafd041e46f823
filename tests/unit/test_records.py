"""analyzer.rundir.records: every record round-trips, version-1 run directories load, loaders refuse."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from analyzer.config.knobs import Knobs
from analyzer.documents import FORMATS
from analyzer.errors import ResultFormatError
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.measurement import GpuStats, Measurement, ServerView, WindowStats
from analyzer.measure.specs import Goals, LoadMode
from analyzer.rundir import records
from analyzer.rundir.measurements import (
    CapacityMeasurement,
    FixedMeasurement,
    MeasurementKind,
    ParetoMeasurement,
    ShapesMeasurement,
    TrialMeasurement,
    measurement_from_dict,
)
from analyzer.rundir.predictions import ConfigPrediction, Prediction, Predictions
from analyzer.rundir.records import SUMMARY_KIND, load_summary, load_trial, load_validation
from analyzer.rundir.results import RunDirectory, write_json
from analyzer.rundir.summary import ConfigEntry, ParetoEntry, RunSummary, StopReason
from analyzer.rundir.trial_record import TrialRecord
from analyzer.rundir.validation import Validation, ValidationCandidate

#: Two run directories written in format version 1, before several keys existed.
EXAMPLES = Path(__file__).resolve().parents[2] / "tests" / "data" / "format-1-runs"
KNOBS = Knobs(16, 500, (16, 8), 2)
GOALS = Goals(p99_ms=50.0, max_error_rate=0.01)


def level(target: float, p99: float, *, valid: bool = True, requests: int = 400) -> Measurement:
    gpu = GpuStats("GPU-1", "H200", 61.0, 70.0, (55.0, 67.0), 9000.0, 141000.0, 300.0, 700.0)
    window = WindowStats(0, 1.0, requests, 0, target, p99 / 2, p99, p99 / 2, offered_rps=target)
    return Measurement(
        mode=LoadMode.REQUEST_RATE,
        target=target,
        throughput_rps=target,
        p50_ms=p99 / 2,
        p90_ms=p99 * 0.8,
        p95_ms=p99 * 0.9,
        p99_ms=p99,
        request_count=requests,
        error_count=0,
        stable=True,
        valid=valid,
        send_lag_p99_ms=0.5,
        server=ServerView(execution_count=50, batch_sizes={4: 50}, gpus=(gpu,)),
        windows=(window,),
        messages=() if valid else ("INVALID: generator saturated",),
    )


def capacity(best: Measurement | None, *points: Measurement) -> CapacityResult:
    return CapacityResult(GOALS, best.target if best else 0.0, points, best, bracketed=True)


def trial(number: int, measurement: TrialMeasurement | None) -> TrialRecord:
    return TrialRecord(
        number=number,
        source="search",
        state="complete",
        config=KNOBS,
        throughput_rps=200.0,
        offered_rps=200.0,
        p50_ms=10.0,
        p90_ms=20.0,
        p99_ms=30.0,
        error_rate=0.001,
        meets_goals=True,
        constraints={"p99_slack": -0.4},
        values=(200.0,),
        started_at="2026-12-01T00:00:00+00:00",
        duration_s=12.5,
        measurement=measurement,
    )


MEASUREMENTS = {
    MeasurementKind.CAPACITY: CapacityMeasurement(
        capacity(level(200, 30), level(100, 20), level(200, 30), level(400, 90))
    ),
    MeasurementKind.FIXED: FixedMeasurement(level(150, 25)),
    MeasurementKind.PARETO: ParetoMeasurement(
        capacity(level(200, 30), level(200, 30)), level(100, 12)
    ),
    MeasurementKind.SHAPES: ShapesMeasurement(
        (
            ("poisson", capacity(level(200, 30), level(200, 30))),
            ("mmpp:20@0.005,0.2@0.1", capacity(level(50, 40), level(50, 40), level(75, 120))),
        )
    ),
}


@pytest.mark.parametrize("kind", list(MeasurementKind))
def test_trial_record_round_trips_for_every_measurement_kind(
    kind: MeasurementKind, tmp_path: Path
) -> None:
    record = trial(3, MEASUREMENTS[kind])
    assert record.measurement is not None and record.measurement.kind is kind
    assert TrialRecord.from_dict(record.to_dict()) == record
    path = tmp_path / "measurement.json"
    records.write_trial(path, record)
    assert load_trial(path) == record
    # The kind is read back from the version-1 shape, not guessed by the reader.
    assert measurement_from_dict(json.loads(path.read_text())["measurement"]).kind is kind


def test_failed_trial_without_measurement_round_trips() -> None:
    record = TrialRecord(-1, "baseline", "failed", Knobs(8, dynamic_batching=False), failure="x")
    assert TrialRecord.from_dict(record.to_dict()) == record
    assert record.operating_point() is None and not record.feasible


def test_operating_point_is_the_best_else_the_gentlest_point() -> None:
    found = CapacityMeasurement(capacity(level(200, 30), level(400, 90), level(200, 30)))
    assert found.operating_point() == level(200, 30)
    missed = CapacityMeasurement(capacity(None, level(400, 90), level(100, 80), level(200, 85)))
    assert missed.operating_point() == level(100, 80)
    assert missed.request_count() == 400
    assert MEASUREMENTS[MeasurementKind.FIXED].operating_point() == level(150, 25)
    assert MEASUREMENTS[MeasurementKind.PARETO].operating_point() == level(200, 30)
    gpus = found.gpu_figures()
    assert gpus == [
        {
            "uuid": "GPU-1",
            "name": "H200",
            "utilization_pct_mean": 61.0,
            "utilization_pct_p95": 70.0,
            "memory_used_peak_mb": 9000.0,
            "memory_total_mb": 141000.0,
            "power_mean_w": 300.0,
            "power_limit_w": 700.0,
        }
    ]


def test_an_unusable_measurement_is_never_feasible() -> None:
    saturated = trial(1, FixedMeasurement(level(150, 25, valid=False)))
    assert saturated.meets_goals and not saturated.feasible
    pareto = ParetoMeasurement(capacity(level(200, 30), level(200, 30)), level(100, 12, requests=0))
    assert pareto.problem() == "reference load: no request completed"
    assert trial(2, MEASUREMENTS[MeasurementKind.CAPACITY]).feasible


def candidate(number: int) -> ValidationCandidate:
    return ValidationCandidate(
        trial_number=number,
        config=KNOBS,
        search_throughput_rps=210.0,
        throughput_rps=(200.0, 190.0),
        p99_ms=(30.0, 33.0),
        meets_goals=(True, True),
        worst_rps=190.0,
        worst_p99_ms=33.0,
        all_meet_goals=True,
        p99_n=(400, None),
        measurements=(MEASUREMENTS[MeasurementKind.CAPACITY], None),
    )


def summary() -> RunSummary:
    entry = ConfigEntry(
        config=KNOBS,
        throughput_rps=190.0,
        p50_ms=12.0,
        p99_ms=33.0,
        meets_goals=True,
        trial_number=4,
        config_path="best/config.pbtxt",
        p99_n=400,
        p99_low_sample=True,
        p99_note="low-sample p99",
        gpus=({"uuid": "GPU-1", "memory_used_peak_mb": 9000.0},),
        validated_throughput_rps=190.0,
        search_throughput_rps=210.0,
        source="validation",
    )
    baseline = ConfigEntry(Knobs(16, dynamic_batching=False), 50.0, 8.0, 20.0, True, -1)
    return RunSummary(
        run_id="m-1",
        model="m",
        device="cuda",
        objective="pareto",
        goals={"p99_ms": 50.0, "min_throughput_rps": 0.0, "max_error_rate": 0.01, "note": ""},
        baseline=baseline,
        best=entry,
        gain=3.8,
        trials={"complete": 9, "failed": 1, "interrupted": 0, "total": 10},
        stop_reason="trials",
        target_url="http://127.0.0.1:1",
        device_requested="auto",
        devices=({"instance": "m_0", "device": "cuda"},),
        server_gpus=({"uuid": "GPU-1", "name": "H200", "memory_total_mb": 141000.0},),
        gain_ci=(3.1, 4.4),
        gain_significant=True,
        gain_repeats=(2, 2),
        gain_text="gain over baseline: 3.80x",
        goal_text="goal p99 <= 50 ms",
        tie_break=None,
        left_on_server={"config": "best", "knobs": KNOBS.to_dict(), "detail": "loaded"},
        pareto=(ParetoEntry(1, 4, KNOBS, 210.0, 30.0, 12.0, "pareto/01/config.pbtxt"),),
        validation=(candidate(4), candidate(-1)),
        environment={"host": "ci", "gpu": ["H200"], "scenario_hash": "abc"},
        scenario={"objective": "pareto", "traffic": {"max_rate_rps": 600.0}},
        study={"storage": "study.journal", "study_name": "m-1"},
        files={"best_config": "best/config.pbtxt"},
        started_at="2026-12-01T00:00:00+00:00",
        finished_at="2026-12-01T00:10:00+00:00",
        duration_s=600.0,
    )


def test_summary_and_validation_round_trip_through_their_files(tmp_path: Path) -> None:
    s = summary()
    assert RunSummary.from_dict(s.to_dict()) == s
    records.write_summary(tmp_path / "summary.json", s)
    assert load_summary(tmp_path) == s  # a run directory or the file itself
    assert load_summary(tmp_path / "summary.json") == s
    assert s.chosen is s.best and s.candidate(-1) == candidate(-1) and s.candidate(7) is None
    v = Validation((candidate(4), candidate(-1)))
    assert Validation.from_dict(v.to_dict()) == v
    records.write_validation(tmp_path / "validation.json", v)
    assert load_validation(tmp_path / "validation.json") == v
    # The keys CI scripts jq stay where README and docs/internals.md say.
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert (doc["format_version"], doc["kind"]) == (1, SUMMARY_KIND)
    assert doc["best"]["config"]["max_batch_size"] == 16 and doc["gain_ci"] == [3.1, 4.4]
    assert doc["best"]["gpus"][0]["uuid"] == "GPU-1" and doc["left_on_server"]["config"] == "best"


def test_run_directory_writes_and_reads_the_records(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    record = trial(3, MEASUREMENTS[MeasurementKind.FIXED])
    run.write_trial(record)
    run.write_summary(summary())
    run.write_validation(Validation((candidate(4),)))
    assert load_trial(run.trial_dir(3) / "measurement.json") == record
    assert load_summary(run.root) == summary()
    assert load_validation(run.validation_json).candidates == (candidate(4),)
    assert [r.number for r in RunDirectory(tmp_path).load_existing_trials()] == [3]
    assert run.trial_rows[3]["p99_slack"] == -0.4


def test_config_entry_from_a_trial_result() -> None:
    result = TrialRecord.from_dict(trial(6, MEASUREMENTS[MeasurementKind.CAPACITY]).to_dict())
    entry = ConfigEntry.from_trial(
        result, config_path="best/config.pbtxt", search_throughput_rps=210.0,
        validated_throughput_rps=190.0,
    )  # fmt: skip
    assert (entry.trial_number, entry.config, entry.throughput_rps) == (6, KNOBS, 200.0)
    assert (entry.p99_n, entry.search_throughput_rps, entry.source) == (400, 210.0, "search")
    assert entry.gpus is not None and entry.gpus[0]["name"] == "H200"
    assert ConfigEntry.from_dict(entry.to_dict()) == entry


def test_version_1_run_directories_load() -> None:
    after = load_summary(EXAMPLES / "sim-after")
    assert (after.run_id, after.objective, after.gain, after.device) == (
        "sim4",
        "throughput",
        12.0,
        "sim",
    )
    assert after.best is not None and after.baseline is not None
    assert after.best.trial_number == 6 and after.best.validated_throughput_rps == 510.0
    assert after.best.config == Knobs(32, 1000, (32, 16), 3)
    assert not after.baseline.config.dynamic_batching and after.baseline.throughput_rps == 50.0
    # Written before these keys existed: read as "not recorded".
    assert after.gain_ci is None and after.gain_text is None and after.best.p99_n is None
    assert [c.trial_number for c in after.validation] == [6, -1]
    assert after.validation[0].throughput_rps == (510.0,)
    assert after.validation[0].measurements[0] is not None
    assert after.validation[0].p99_n == ()
    assert RunSummary.from_dict(after.to_dict()) == after
    six = load_trial(EXAMPLES / "sim-after" / "trials" / "006" / "measurement.json")
    assert six.measurement is not None and six.measurement.kind is MeasurementKind.CAPACITY
    assert (six.throughput_rps, six.feasible) == (600.0, True)
    three = load_trial(EXAMPLES / "sim-after" / "trials" / "003" / "measurement.json")
    assert three.p99_ms == 32.591 and three.config == Knobs(8, 4000, (8, 4), 2)
    assert (
        load_validation(EXAMPLES / "sim-after" / "validation.json").candidates == after.validation
    )

    before = load_summary(EXAMPLES / "sim-before")
    assert before.gain is None and before.best is not None
    assert (before.best.trial_number, before.best.validated_throughput_rps) == (7, 293.26171875)
    baseline = load_trial(EXAMPLES / "sim-before" / "baseline" / "measurement.json")
    assert baseline.throughput_rps == 0.0 and not baseline.feasible
    point = baseline.operating_point()  # nothing passed: the gentlest level tried
    assert point is not None and point.target == 6.25


def test_loaders_refuse_newer_versions_other_kinds_and_damaged_files(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_json(path, {**summary().to_dict(), "format_version": 2})
    with pytest.raises(
        ResultFormatError, match=r"format_version 2; this perfsweep reads version 1"
    ):
        load_summary(path)
    with pytest.raises(ResultFormatError, match="Use the perfsweep version that wrote it"):
        load_summary(path)
    headless = summary().to_dict()
    del headless["format_version"]
    write_json(path, headless)
    with pytest.raises(ResultFormatError, match="format_version None"):
        load_summary(path)
    write_json(path, {**summary().to_dict(), "kind": "perfsweep.trial"})
    with pytest.raises(ResultFormatError, match=r"not a perfsweep\.summary file"):
        load_summary(path)
    damaged = trial(1, None).to_dict()
    del damaged["config"]
    write_json(tmp_path / "t.json", damaged)
    with pytest.raises(ResultFormatError, match=r"t\.json.*damaged.*config"):
        load_trial(tmp_path / "t.json")
    with pytest.raises(ResultFormatError, match="none of capacity, fixed, pareto or shapes"):
        measurement_from_dict({"something": 1})


def test_stop_reasons_are_written_as_their_strings_and_read_back_typed(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    for reason in StopReason:
        records.write_summary(path, replace(summary(), stop_reason=reason))
        assert json.loads(path.read_text())["stop_reason"] == reason.value
        assert load_summary(path).stop_reason is reason
    headless = summary().to_dict()
    del headless["stop_reason"]  # a summary written before the key: "not recorded"
    assert RunSummary.from_dict(headless).stop_reason is StopReason.NOT_RECORDED
    with pytest.raises(ResultFormatError, match=r"damaged.*'budget'"):
        RunSummary.from_dict({**summary().to_dict(), "stop_reason": "budget"})


def test_an_older_version_is_migrated_on_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The migration chain: a version-0 document is lifted step by step to the current one."""

    def v0_to_v1(doc: dict) -> dict:
        doc["run_id"] = doc.pop("id")
        return {**doc, "format_version": 1}

    history = replace(FORMATS[SUMMARY_KIND], migrations={0: v0_to_v1})
    monkeypatch.setitem(FORMATS, SUMMARY_KIND, history)
    doc = {**summary().to_dict(), "format_version": 0, "id": "old"}
    del doc["run_id"]
    assert RunSummary.from_dict(doc).run_id == "old"
    with pytest.raises(ResultFormatError, match="format_version -1"):
        RunSummary.from_dict({**doc, "format_version": -1})


def test_predictions_and_the_new_optional_fields_round_trip(tmp_path: Path) -> None:
    prediction = Prediction(400.0, 360.0, 440.0)
    other = Knobs(8, 0, (), 1)
    predictions = Predictions(
        {"batch_sizes": [1, 8, 16]},
        (
            ConfigPrediction(other, Prediction(300.0, 270.0, 330.0)),
            ConfigPrediction(KNOBS, prediction),
        ),
    )
    run = RunDirectory(tmp_path)
    records.write_predictions(run.predictions_json, predictions)
    loaded = records.load_predictions(tmp_path)
    assert loaded == predictions
    assert loaded.get(KNOBS) == prediction and loaded.get(Knobs(4, 0, (), 1)) is None
    assert [c.config for c in loaded.ranked()] == [KNOBS, other]
    raw = json.loads(run.predictions_json.read_text())
    assert raw["kind"] == "perfsweep.predictions" and raw["format_version"] == 1
    assert raw["configs"][1] == {"config": KNOBS.to_dict(), **prediction.to_dict()}
    assert prediction.contains(360.0) and not prediction.contains(441.0)

    record = replace(trial(3, None), prediction=prediction)
    assert TrialRecord.from_dict(record.to_dict()) == record
    older = record.to_dict()
    del older["prediction"]
    assert TrialRecord.from_dict(older).prediction is None

    summary = RunSummary(
        run_id="r",
        model="m",
        device="sim",
        objective="throughput",
        goals={},
        baseline=None,
        best=None,
        gain=None,
        trials={"total": 0},
        stop_reason=StopReason.TRIALS,
        search_strategy="predict",
        phases={"baseline": 1.5, "search": 10.0},
    )
    assert RunSummary.from_dict(summary.to_dict()) == summary
    old = summary.to_dict()
    for key in ("search_strategy", "search_note", "phases"):
        del old[key]
    back = RunSummary.from_dict(old)
    assert back.search_strategy is None and back.phases == {}


def test_a_shapes_measurement_stands_for_its_worst_shape() -> None:
    shapes = MEASUREMENTS[MeasurementKind.SHAPES]
    assert isinstance(shapes, ShapesMeasurement)
    assert shapes.capacities() == {"poisson": 200.0, "mmpp:20@0.005,0.2@0.1": 50.0}
    assert shapes.worst_shape == "mmpp:20@0.005,0.2@0.1"
    assert shapes.operating_point() == level(50, 40)
    assert shapes.capacity.capacity_rps == 50.0
