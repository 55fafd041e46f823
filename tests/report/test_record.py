"""The report record as data: every value traced back to the run directory's files."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest

from analyzer.errors import ResultFormatError
from analyzer.report import build_record, load_run
from analyzer.report.points import pareto_front
from analyzer.report.record import PARAM_TO_KNOB
from analyzer.rundir.results import load_summary, load_trial_record
from tests.report.conftest import HOSTILE, sweep_run_dir


def _records(run: Path) -> dict[int, dict]:
    paths = [run / "baseline" / "measurement.json", *sorted(run.glob("trials/*/measurement.json"))]
    return {int(r["number"]): r for r in map(load_trial_record, paths)}


@pytest.fixture(scope="module")
def record(planted_run: Path):
    return build_record(load_run(planted_run))


def test_verdict_matches_summary(planted_run: Path, record) -> None:
    summary = load_summary(planted_run)
    v = record.verdict
    assert v.model == "planted"
    assert v.best is not None and v.baseline is not None
    assert v.best.trial_number == summary["best"]["trial_number"]
    assert v.best.throughput_rps == pytest.approx(summary["best"]["throughput_rps"])
    assert v.best.p99_ms == pytest.approx(summary["best"]["p99_ms"])
    assert v.best.validated_throughput_rps == pytest.approx(
        summary["best"]["validated_throughput_rps"]
    )
    assert v.baseline.throughput_rps == pytest.approx(summary["baseline"]["throughput_rps"])
    baseline_record = load_trial_record(planted_run / "baseline" / "measurement.json")
    assert v.baseline.offered_rps == pytest.approx(baseline_record["offered_rps"])
    assert f"{summary['best']['throughput_rps']:.1f} req/s" in v.headline
    assert f"{summary['best']['validated_throughput_rps']:.1f} req/s (worst repeat)" in v.headline
    assert v.gain == pytest.approx(summary["gain"])
    assert v.goals_met is True
    assert v.device == "sim"
    assert v.goals["p99_ms"] == 25.0
    assert f"{summary['gain']:.2f}x" in v.headline
    # The simulated device and the failed trial are called out.
    assert any("simulated device" in w for w in v.warnings)
    assert any("1 trial(s) failed" in w and "planted failure" in w for w in v.warnings)


def test_trials_match_trial_records(planted_run: Path, record) -> None:
    files = _records(planted_run)
    assert [t.number for t in record.trials] == sorted(files)
    for t in record.trials:
        raw = files[t.number]
        assert t.state == raw["state"]
        assert t.config == raw["config"]
        if raw["state"] == "complete":
            assert t.throughput_rps == pytest.approx(raw["throughput_rps"])
            assert t.p99_ms == pytest.approx(raw["p99_ms"])
            assert t.meets_goals == raw["meets_goals"]
            op = raw["measurement"]["best"]
            assert t.stable == op["stable"] and t.valid == op["valid"]
        else:
            assert t.throughput_rps is None and t.p99_ms is None and not t.meets_goals
            assert "planted failure" in (t.failure or "")
    assert sum(t.state == "failed" for t in record.trials) == 1


def test_front_is_non_dominated(record) -> None:
    feasible = [t for t in record.trials if t.meets_goals and t.number >= 0]
    front = [t for t in feasible if t.on_front]
    assert front
    for t in front:
        assert not any(
            o.throughput_rps >= t.throughput_rps
            and o.p99_ms <= t.p99_ms
            and (o.throughput_rps > t.throughput_rps or o.p99_ms < t.p99_ms)
            for o in feasible
        )
    # The highest-throughput feasible trial is always on the front.
    top = max(feasible, key=lambda t: t.throughput_rps)
    assert top.on_front


def test_pareto_front_known_answer() -> None:
    points = [
        (0, 100.0, 10.0),
        (1, 200.0, 20.0),
        (2, 150.0, 25.0),
        (3, 200.0, 30.0),
        (4, 90.0, 5.0),
    ]
    assert pareto_front(points) == {0, 1, 4}


def test_progress_best_so_far(record) -> None:
    pts = record.progress.points
    assert [p.number for p in pts] == [t.number for t in record.trials if t.number >= 0]
    running = None
    for p, t in zip(pts, [t for t in record.trials if t.number >= 0], strict=True):
        if t.meets_goals:
            running = max(running or 0.0, t.throughput_rps)
        assert p.best_so_far == running
    best_search = max(t.throughput_rps for t in record.trials if t.number >= 0 and t.meets_goals)
    assert pts[-1].best_so_far == pytest.approx(best_search)


def test_slices_and_importance(record) -> None:
    slices = record.progress.slices
    assert "max_batch_size" in slices
    by_number = {t.number: t for t in record.trials}
    for point in slices["max_batch_size"]:
        assert point.knob_value == by_number[point.number].config["max_batch_size"]
        assert point.objective == by_number[point.number].throughput_rps
    importances = record.progress.importances
    assert importances is not None, record.missing
    assert set(importances) <= set(PARAM_TO_KNOB.values())
    assert sum(importances.values()) == pytest.approx(1.0, abs=0.01)
    assert list(importances.values()) == sorted(importances.values(), reverse=True)


def test_breakdown_comes_from_server_view(planted_run: Path, record) -> None:
    files = _records(planted_run)
    roles = {b.role: b for b in record.breakdown}
    assert set(roles) == {"baseline", "best"}
    best = roles["best"]
    view = files[best.trial_number]["measurement"]["best"]["server"]
    assert best.queue_us == view["queue_us"]
    assert best.compute_infer_us == view["compute_infer_us"]
    assert best.batch_sizes == {int(k): v for k, v in view["batch_sizes"].items()}
    assert best.execution_count == view["execution_count"]
    assert best.measured_at_rps == files[best.trial_number]["measurement"]["best"]["target"]
    assert best.instance_busy_pct is not None and 0 < best.instance_busy_pct <= 100
    # The dynamic batcher forms bigger batches than the baseline's.
    assert best.avg_batch_size > roles["baseline"].avg_batch_size


def test_load_curves_are_the_capacity_points(planted_run: Path, record) -> None:
    files = _records(planted_run)
    for curve in record.load_curves:
        capacity = files[curve.trial_number]["measurement"]
        assert [p.offered_rps for p in curve.points] == sorted(
            p["target"] for p in capacity["points"]
        )
        assert curve.capacity_rps == capacity["capacity_rps"]
        passing = [p.offered_rps for p in curve.points if p.meets_goals]
        assert max(passing) == curve.capacity_rps
        assert curve.first_failing_rps is not None and curve.first_failing_rps > curve.capacity_rps
        assert all(not p.meets_goals for p in curve.points if p.offered_rps > curve.capacity_rps)


def test_time_series_are_the_windows(planted_run: Path, record) -> None:
    files = _records(planted_run)
    search = [s for s in record.time_series if s.source == "search"]
    assert {s.role for s in search} == {"baseline", "best"}
    for s in search:
        windows = files[s.trial_number]["measurement"]["best"]["windows"]
        assert [p.throughput_rps for p in s.points] == [w["throughput_rps"] for w in windows]
        assert [p.p99_ms for p in s.points] == [w["p99_ms"] for w in windows]
        assert s.points[-1].end_s == pytest.approx(sum(w["duration_s"] for w in windows))
        assert s.stable and s.valid and not s.flags
    # validation.json keeps every repeat's measurement: each becomes a series of its own (a
    # capacity re-measurement's operating point, or the one level of a check at the winner's
    # capacity, ``budget.validation = "check"``).
    candidates = json.loads((planted_run / "validation.json").read_text())["candidates"]
    expected = [
        (c["trial_number"], m["best"]["windows"] if "points" in m else m["windows"])
        for c in candidates
        for m in c.get("measurements") or ()
        if m and (m.get("best") or m.get("windows"))
    ]
    validation = [s for s in record.time_series if s.source == "validation"]
    assert expected and len(validation) == len(expected)
    for s, (number, windows) in zip(validation, expected, strict=True):
        assert s.trial_number == number
        assert [p.p99_ms for p in s.points] == [w["p99_ms"] for w in windows]
    assert "validation_series" not in record.missing


def test_configs_and_provenance(planted_run: Path, record) -> None:
    assert record.configs.best == (planted_run / "best" / "config.pbtxt").read_text()
    assert record.configs.baseline == (planted_run / "baseline" / "config.pbtxt").read_text()
    assert record.configs.diff and record.configs.diff.startswith("--- baseline/config.pbtxt")
    best, base = record.verdict.best.config, record.verdict.baseline.config
    lines = record.configs.diff.splitlines()[2:]
    added = [x[1:] for x in lines if x.startswith("+")]
    removed = [x[1:] for x in lines if x.startswith("-")]
    assert all(x in record.configs.best.splitlines() for x in added)
    assert all(x in record.configs.baseline.splitlines() for x in removed)
    if best["max_batch_size"] != base["max_batch_size"]:
        assert f"max_batch_size: {best['max_batch_size']}" in added
    if best["instance_count"] != base["instance_count"]:
        assert f"  count: {best['instance_count']}" in added
    assert record.provenance.scenario_toml == (planted_run / "scenario.toml").read_text()
    assert record.provenance.environment["packages"]["optuna"]
    assert "scenario.toml" in record.provenance.command
    assert [v.trial_number for v in record.validation] == [
        c["trial_number"] for c in load_summary(planted_run)["validation"]
    ]
    assert sum(v.chosen for v in record.validation) == 1
    # Validation at the winner's capacity (the default): each row says what the check found.
    for v, c in zip(record.validation, load_summary(planted_run)["validation"], strict=True):
        assert v.check_rps == c["check_rps"] and v.check_met == c["check_met"]
    # The winner is checked at its capacity less the default capacity_resolution (10 %).
    assert record.validation[0].check_rps == pytest.approx(
        0.9 * record.validation[0].search_throughput_rps
    )


def test_to_dict_is_json(record) -> None:
    data = json.loads(json.dumps(record.to_dict(), allow_nan=False))
    assert data["kind"] == "perfsweep.report" and data["format_version"] == 1
    assert data["verdict"]["best"]["trial_number"] == record.verdict.best.trial_number
    assert len(data["trials"]) == len(record.trials)


def test_infeasible_trials_and_no_gain(hostile_run: Path) -> None:
    record = build_record(load_run(hostile_run))
    assert record.verdict.model == HOSTILE
    assert any(not t.meets_goals and t.state == "complete" for t in record.trials)
    assert record.verdict.baseline is not None and not record.verdict.baseline.meets_goals
    assert record.verdict.gain is None
    assert "no gain to state" in record.verdict.headline
    assert any("baseline config missed" in w for w in record.verdict.warnings)


@pytest.mark.usefixtures("serves")
def test_degrades_without_server_view_windows_or_study(tmp_path: Path) -> None:
    """The plain planted fake records no server view and no windows: those parts say so."""
    from analyzer.config.scenario import load_scenario
    from analyzer.sweep.loop import run_sweep
    from tests.sweep.planted import FakeLoadGenerator, FakeTarget

    scenario = load_scenario(
        None,
        {"budget.trials": 5, "budget.validate_top": 1, "goals.p99_ms": 25.0},
        env={},
    )
    target = FakeTarget()
    run_sweep(scenario, target=target, load=FakeLoadGenerator(target), run_dir=tmp_path / "run")
    (tmp_path / "run" / "study.journal").unlink()
    record = build_record(load_run(tmp_path / "run"))
    assert record.breakdown == ()
    assert "not recorded" in record.missing["breakdown"]
    assert record.time_series == ()
    assert "not recorded" in record.missing["time_series"]
    assert record.progress.importances is None
    assert "journal" in record.missing["importance"]
    assert record.load_curves  # capacity points are still there


@pytest.mark.usefixtures("takes_seconds")
def test_latency_objective_has_no_load_curves(tmp_path: Path) -> None:
    sweep_run_dir(tmp_path / "run", objective="latency", trials=5)
    record = build_record(load_run(tmp_path / "run", importances=False))
    assert record.load_curves == ()
    assert "fixed load" in record.missing["load_curves"]
    assert record.progress.objective_name == "p99_ms"
    assert not record.progress.higher_is_better
    assert record.verdict.gain_label == "baseline p99 / best p99"
    values = [p.best_so_far for p in record.progress.points if p.best_so_far is not None]
    assert values == sorted(values, reverse=True)  # lower is better: never goes up
    if record.verdict.best is not None:
        assert math.isfinite(record.verdict.best.p99_ms)


def test_refuses_unknown_format_version(planted_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(planted_run, copy)
    summary = json.loads((copy / "summary.json").read_text())
    summary["format_version"] = 99
    (copy / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ResultFormatError, match="format_version 99"):
        load_run(copy)


def test_moved_run_directory_still_finds_its_study(planted_run: Path, tmp_path: Path) -> None:
    """A CI artifact is a copy elsewhere: run.json's journal path is stale, the file is local."""
    copy = tmp_path / "artifact"
    shutil.copytree(planted_run, copy)
    state = json.loads((copy / "run.json").read_text())
    assert Path(state["storage"]).parent == planted_run
    state["storage"] = str(tmp_path / "gone" / "study.journal")
    (copy / "run.json").write_text(json.dumps(state))
    record = build_record(load_run(copy))
    assert record.progress.importances is not None


def test_explanation_uses_the_breakdown(record) -> None:
    views = {b.role: b for b in record.breakdown}
    text = "\n".join(record.explanation)
    assert f"{views['best'].avg_batch_size:.2f} requests per execution" in text
    assert f"vs {views['baseline'].avg_batch_size:.2f} for the baseline" in text
    per_request = views["best"].compute_infer_us / views["best"].avg_batch_size / 1000
    assert f"{per_request:.3f} ms vs" in text


@pytest.mark.usefixtures("serves")
def test_pareto_objective_uses_the_study_front(tmp_path: Path) -> None:
    from analyzer.report.figures import throughput_vs_p99

    sweep_run_dir(tmp_path / "run", objective="pareto", trials=6)
    summary = load_summary(tmp_path / "run")
    record = build_record(load_run(tmp_path / "run", importances=False))
    assert {t.number for t in record.trials if t.on_front} == {
        p["trial_number"] for p in summary["pareto"]
    }
    files = _records(tmp_path / "run")
    for t in record.trials:
        if t.state == "complete":
            assert t.reference_p99_ms == pytest.approx(files[t.number]["values"][1])
    figure = throughput_vs_p99(record)
    assert figure is not None and "p99 at the reference load" in figure.svg


@pytest.mark.usefixtures("serves")
def test_unbracketed_best_is_flagged(tmp_path: Path) -> None:
    """A rate ceiling below the best config's capacity: the report says the capacity is a floor."""
    from analyzer.config.scenario import load_scenario
    from analyzer.sweep.loop import run_sweep
    from tests.report.conftest import ServerViewLoadGenerator
    from tests.sweep.planted import FakeTarget

    scenario = load_scenario(
        None,
        {
            "budget.trials": 4,
            "budget.validate_top": 1,
            "goals.p99_ms": 25.0,
            "traffic.min_rate_rps": 10.0,
            "traffic.max_rate_rps": 150.0,
        },
        env={},
    )
    target = FakeTarget()
    run_sweep(scenario, target=target, load=ServerViewLoadGenerator(target), run_dir=tmp_path / "r")
    record = build_record(load_run(tmp_path / "r", importances=False))
    best_curve = next(c for c in record.load_curves if c.role == "best")
    assert best_curve.first_failing_rps is None
    assert best_curve.capacity_rps == pytest.approx(150.0)
    assert any("traffic.max_rate_rps (150 req/s)" in w for w in record.verdict.warnings)


def test_recorded_command_is_shown_verbatim(planted_run: Path) -> None:
    run = load_run(planted_run, importances=False)
    state = dict(run.run_state or {})
    state["command"] = ["perfsweep", "run", "--model", "resnet50", "--p99-ms", "40 ms; rm -rf /"]
    record = build_record(dataclasses.replace(run, run_state=state))
    assert record.provenance.command == "perfsweep run --model resnet50 --p99-ms '40 ms; rm -rf /'"
    assert record.provenance.command_note == ""
    assert "not recorded" in build_record(run).provenance.command_note


def test_unfinished_run_says_what_to_do(planted_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "running"
    shutil.copytree(planted_run, copy)
    (copy / "summary.json").unlink()
    with pytest.raises(ResultFormatError, match=r"no summary.json yet.*--resume"):
        load_run(copy)


def test_every_study_parameter_is_named_by_its_knob() -> None:
    from analyzer.report.record import knob_of_param

    assert knob_of_param("log2_mbs") == "max_batch_size"
    assert knob_of_param("cache_idx") == "response_cache"
    assert knob_of_param("policy_idx") == "queue_policy"
    assert knob_of_param("cand_idx") == "max_candidate_sequences"
    assert knob_of_param("instances_1") == "instance_count (group 1)"
    assert knob_of_param("something_new") == "something_new"
