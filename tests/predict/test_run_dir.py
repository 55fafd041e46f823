"""Run directories as analyzer.predict reads them (through analyzer.rundir.records): every level of
a pareto trial counts, refused records are named, the default config is the summary's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.config.knobs import Knobs
from analyzer.errors import InputError
from analyzer.measure.capacity import CapacityResult
from analyzer.measure.measurement import Measurement, ServerView, WindowStats
from analyzer.measure.specs import Goals, LoadMode
from analyzer.predict import ProfileError
from analyzer.predict.fitting import from_run_dir, run_dir_samples
from analyzer.predict.planner import PlanRequest, plan
from analyzer.predict.sim_records import SimConfig
from analyzer.rundir import records
from analyzer.rundir.measurements import ParetoMeasurement
from analyzer.rundir.results import RunDirectory
from analyzer.rundir.summary import ConfigEntry, RunSummary, StopReason
from analyzer.rundir.trial_record import TrialRecord

GOALS = Goals(p99_ms=50.0)
KNOBS = Knobs(8, 500, (), 1)


def infer_us(hist: dict[int, int]) -> float:
    """Planted device time 3 + 0.5 b ms per execution, as the per-request mean reports it."""
    items = sum(b * n for b, n in hist.items())
    return 1000.0 * sum(n * b * (3.0 + 0.5 * b) for b, n in hist.items()) / items


def level(target: float, *hists: dict[int, int]) -> Measurement:
    windows = tuple(
        WindowStats(
            i,
            1.0,
            100,
            0,
            target,
            5.0,
            10.0,
            6.0,
            server=ServerView(
                compute_input_us=1000.0,
                compute_infer_us=infer_us(hist),
                compute_output_us=200.0,
                batch_sizes=hist,
            ),
        )
        for i, hist in enumerate(hists)
    )
    return Measurement(
        mode=LoadMode.REQUEST_RATE,
        target=target,
        throughput_rps=target,
        p50_ms=5.0,
        p90_ms=8.0,
        p95_ms=9.0,
        p99_ms=10.0,
        request_count=100 * len(hists),
        error_count=0,
        stable=True,
        valid=True,
        send_lag_p99_ms=0.1,
        server=None,
        windows=windows,
    )


def pareto_run(root: Path) -> RunDirectory:
    """A pareto run: one trial whose capacity points reach batch 4 and whose reference level
    alone reaches batch 8; summary.json names the model and the best config."""
    run = RunDirectory(root)
    low, high = level(100.0, {1: 50}), level(300.0, {1: 10, 2: 20, 4: 5})
    measurement = ParetoMeasurement(
        CapacityResult(GOALS, 300.0, (low, high), high, bracketed=False),
        level(200.0, {4: 10, 8: 10}),
    )
    record = TrialRecord(0, "search", "complete", KNOBS, measurement=measurement)
    records.write_trial(run.trial_dir(0) / "measurement.json", record)
    entry = ConfigEntry(KNOBS, 300.0, 5.0, 10.0, True, 0)
    summary = RunSummary(
        run_id="planted",
        model="planted_model",
        device="sim",
        objective="pareto",
        goals={"p99_ms": 50.0},
        baseline=None,
        best=entry,
        gain=None,
        trials={"complete": 1, "total": 1},
        stop_reason=StopReason.TRIALS,
    )
    records.write_summary(run.summary_json, summary)
    return run


def test_a_pareto_trial_gives_its_capacity_points_and_reference_level(tmp_path: Path) -> None:
    pareto_run(tmp_path)
    samples = run_dir_samples(tmp_path)
    assert sorted(max(s.batch_sizes) for s in samples) == [1, 4, 8]
    profile = from_run_dir(tmp_path)
    assert profile.model == "planted_model"
    assert profile.max_batch_size == 8  # only the reference level executed batches of 8
    for b in (1, 3, 8):
        assert profile.timing(b).infer_ms == pytest.approx(3.0 + 0.5 * b, rel=1e-6)
    assert profile.timings[-1].executions == 10


def test_refused_trial_records_are_named(tmp_path: Path) -> None:
    run = pareto_run(tmp_path)
    path = run.trial_dir(0) / "measurement.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "format_version": 99}))
    (run.trial_dir(1)).mkdir(parents=True)
    (run.trial_dir(1) / "measurement.json").write_text('{"half-written')
    assert run_dir_samples(tmp_path) == []
    with pytest.raises(ProfileError, match=r"none of its 2 trial record\(s\) could be read") as err:
        from_run_dir(tmp_path)
    assert "format_version 99" in str(err.value)


def test_the_default_config_is_the_summarys_best(tmp_path: Path) -> None:
    pareto_run(tmp_path)
    report = plan(PlanRequest(run_dir=tmp_path, rate_rps=50.0, requests=500))
    assert report.config == SimConfig(8, 500, (), 1, True)
    assert report.config_source == "the run's best config"
    (tmp_path / "summary.json").write_text('{"kind": "perfsweep.summary", "format_version": 99}')
    with pytest.raises(InputError, match=r"format_version 99.*give --max-batch-size"):
        plan(PlanRequest(run_dir=tmp_path, rate_rps=50.0, requests=500))
