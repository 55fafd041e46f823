"""Sweeps of the bundled ``resnet50.sim`` scenario in virtual time and the reports they write.

Each sweep runs through the library (``run_sweep``, report on) against the reference server's
simulated device simulated in virtual time (:mod:`analyzer.predict.virtual`), in the test
process: one ``tpe`` sweep of a few trials, whose report must show every part its records hold
(search progress, parameter importance, slices, server statistics, load curves), and one
``predict`` sweep on a smaller space, whose report draws the simulator's predictions against
the measurements. The virtual load records no per-window results and the virtual server
publishes no GPU metrics: the measurement windows over time and the GPU figures are pinned by
the live reference-server sweep.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analyzer.config.scenario import bundled_scenario, load_scenario
from analyzer.report import build_record, load_run
from analyzer.sweep.loop import run_sweep
from tests.report.test_html import FIGURES, assert_no_external_urls, embedded, parse

pytestmark = [pytest.mark.usefixtures("takes_seconds")]

#: The bundled scenario's search, with TPE: enough complete trials with different configs for
#: parameter importance (4) and slices (2).
TPE = {
    "search.strategy": "tpe",
    "budget.trials": 5,
    "budget.patience": 5,
    # Five whole trials, whatever their steps take: the page is the subject, not the budget.
    "budget.time_budget_s": 1800,
}
#: The bundled scenario's ``predict`` search on a space small enough to simulate in seconds.
PREDICT = {
    "space.max_batch_size": [1, 8],
    "space.delay_steps": 1,
    "space.preferred_batch_size": "none",
    "space.instance_count": [1, 2],
}


@pytest.fixture(scope="module")
def _simulate_in_this_process() -> Iterator[None]:
    """The predict phase's simulations in one process, not a pool: no child process, and the
    same answers (each group of configs is searched alike whatever the number of workers)."""
    with pytest.MonkeyPatch.context() as patch:
        for module in ("analyzer.search.strategy", "analyzer.sweep.predictions"):
            patch.setattr(f"{module}.sim_workers", lambda: 1)
        yield


def virtual_run(root: Path, overrides: dict[str, Any]) -> Path:
    """The bundled ``resnet50.sim`` scenario with ``overrides``, swept in virtual time into
    ``root`` with its report."""
    path = bundled_scenario("resnet50", "sim")
    assert path is not None
    scenario = load_scenario(path, {**overrides, "model.server": "virtual"}, env={})
    assert scenario.run.report
    run_sweep(scenario, run_dir=root)
    return root


@pytest.fixture(scope="module")
def tpe_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return virtual_run(tmp_path_factory.mktemp("tpe") / "resnet50-sim", TPE)


@pytest.fixture(scope="module")
def predict_run(tmp_path_factory: pytest.TempPathFactory, _simulate_in_this_process: None) -> Path:
    return virtual_run(tmp_path_factory.mktemp("predict") / "resnet50-sim", PREDICT)


def shown_figures(run_dir: Path) -> tuple[dict[str, Any], set[str | None]]:
    """The record embedded in the run's report (the sweep used :mod:`analyzer.report`, not
    the minimal fallback) and the figures the page shows."""
    _, parser = parse(run_dir / "report.html")
    data = embedded(parser)
    assert data["kind"] == "perfsweep.report"
    assert data["verdict"]["model"] == "resnet50" and data["verdict"]["device"] == "sim"
    assert_no_external_urls(parser)
    return data, {a.get("data-figure") for tag, a in parser.tags if tag == "figure"}


def test_sweep_writes_the_full_report(tpe_run: Path) -> None:
    data, shown = shown_figures(tpe_run)
    complete = [t for t in data["trials"] if t["number"] >= 0 and t["state"] == "complete"]
    assert len(complete) == TPE["budget.trials"]
    assert len({json.dumps(t["config"]) for t in complete}) >= 2
    assert data["progress"]["importances"] and data["progress"]["slices"]
    # A tpe run draws no predictions, and the page says how to get them.
    assert data["verdict"]["search_strategy"] == "tpe"
    assert "--search predict" in data["missing"]["prediction"]
    assert "predictions.json" in data["missing"]["landscape"]
    # The virtual load records no per-window results: the page says so instead of a figure.
    assert data["missing"]["time_series"].startswith("not recorded")
    phases = [p["name"] for p in data["phases"]["phases"]]
    assert phases[0] == "baseline" and "search" in phases and "validation" in phases
    assert shown == set(FIGURES) - {"time_series"}, data["missing"]


def test_a_predict_sweep_draws_its_predictions_against_the_measurements(
    predict_run: Path,
) -> None:
    data, shown = shown_figures(predict_run)
    # The simulator's predictions are drawn against the measurements.
    assert data["verdict"]["search_strategy"] == "predict"
    assert "prediction" not in data["missing"] and "landscape" not in data["missing"]
    assert data["landscape"]["configs"] > 0
    phases = [p["name"] for p in data["phases"]["phases"]]
    assert phases[0] == "baseline" and "search" in phases and "predict" in phases
    # The measured best lands in its predicted band at once, so the run stops with too few
    # trials for importance: the page says why.
    complete = [t for t in data["trials"] if t["number"] >= 0 and t["state"] == "complete"]
    assert len(complete) < 4 and "too few" in data["missing"]["importance"]
    expected = set(FIGURES) | {"predicted_vs_measured", "landscape"}
    expected -= {"importance", "time_series"}
    if not data["progress"]["slices"]:
        assert len(complete) < 2 or len({json.dumps(t["config"]) for t in complete}) < 2
        expected.discard("slices")
    assert shown == expected, data["missing"]


def test_measurements_reach_the_record(tpe_run: Path) -> None:
    record = build_record(load_run(tpe_run))
    files = {
        int(r["number"]): r
        for r in (
            json.loads(p.read_text())
            for p in [
                tpe_run / "baseline" / "measurement.json",
                *tpe_run.glob("trials/*/measurement.json"),
            ]
        )
    }
    assert record.breakdown, record.missing
    for b in record.breakdown:
        op = files[b.trial_number]["measurement"]["best"] or min(
            files[b.trial_number]["measurement"]["points"], key=lambda p: p["target"]
        )
        server = op["server"]
        assert b.execution_count == server["execution_count"] > 0
        assert b.compute_infer_us == server["compute_infer_us"] > 0
        # batch_stats counts every execution once, by its batch size.
        assert sum(b.batch_sizes.values()) == pytest.approx(b.execution_count, rel=0.02)
        assert b.avg_batch_size >= 1.0
    assert record.load_curves
    for curve in record.load_curves:
        points = files[curve.trial_number]["measurement"]["points"]
        assert len(curve.points) == len(points)
    env = record.provenance.environment
    assert env["cpu_count"] and env["packages"]["locust"]
    assert env["target"]["kind"] == "virtual"
