"""`perfsweep run --mix a=3,b=1` tunes several models served together: every model's knobs in
one search, the load drawn across the models by weight, each model held to its own p99, one
config.pbtxt per model.

Two simulated models on the reference server's simulated device (their instances share it), in
virtual time (``--server virtual``: the command in the test process, the mix simulated on one
device), a tiny budget, ``--search predict`` (each model's profile taken, the mix simulated over
the joint space): this pins the plumbing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.config.model_config import knobs_of
from analyzer.config.pipeline import JointKnobs
from analyzer.rundir.results import load_summary, load_trial_record, parse_config_text
from tests.support.servers import write_sim_model
from tests.support.sweeps import small_scenario, virtual_sweep

pytestmark = [pytest.mark.usefixtures("takes_seconds")]

MODELS = ("detect", "classify")
BATCHING = "dynamic_batching { }"


@pytest.fixture(autouse=True)
def _simulate_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The predict phase's simulations in one process, not a pool: no child process, and the
    same answers (each group of configs is searched alike whatever the number of workers)."""
    for module in ("analyzer.search.strategy", "analyzer.sweep.predictions"):
        monkeypatch.setattr(f"{module}.sim_workers", lambda: 1)


def test_a_mix_of_models_is_tuned_in_one_search_each_held_to_its_goal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    write_sim_model(repo, "detect", 3.0, 0.3, max_batch_size=8, dynamic_batching=BATCHING)
    write_sim_model(
        repo, "classify", 1.0, 0.1, max_batch_size=8, dynamic_batching=BATCHING, width=32
    )
    scenario = tmp_path / "mix.toml"
    # classify is held to a tighter p99 than the run's (which detect takes).
    scenario.write_text(
        small_scenario(2, max_rate_rps=300.0, p99_ms=150.0, validate_top=0)
        + '[[models]]\nname = "detect"\nshare = 3\n'
        + '[[models]]\nname = "classify"\nshare = 1\np99_ms = 80\n'
    )
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *("--scenario", str(scenario), "--run-dir", str(run_dir)),
        *("--model-repository", str(repo), "--device", "sim", "--search", "predict"),
        "--report",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    # Each model's profile taken, the mix predicted on one device with each model's share and
    # goal.
    assert summary["search_strategy"] == "predict", summary.get("search_note")
    predictions = json.loads((run_dir / "predictions.json").read_text())
    assert predictions["profile"]["mix"] == {
        "detect": {"share": 0.75, "p99_ms": 150.0},
        "classify": {"share": 0.25, "p99_ms": 80.0},
    }
    assert predictions["configs"] and all(
        list(c["config"]["stages"]) == list(MODELS) for c in predictions["configs"]
    )
    assert list(summary["baseline"]["config"]["stages"]) == list(MODELS)
    complete = summary["trials"]["complete"]
    assert 1 <= complete <= 2
    for n in range(complete):
        folder = run_dir / "trials" / f"{n:03d}"
        record = load_trial_record(folder / "measurement.json")
        knobs = JointKnobs.from_dict(record["config"])
        assert knobs.names == MODELS
        for model in MODELS:  # the configs the trial loaded, one per model
            written = parse_config_text((folder / model / "config.pbtxt").read_text())
            assert written.name == model and knobs_of(written) == knobs.stage(model)
        point = record["measurement"]["best"]
        assert point is not None
        # The load went to both models by weight, each judged on its own goal; each model's
        # statistics were read in the same windows.
        classes = {c["name"]: c for c in point["classes"]}
        assert {c["model"] for c in classes.values()} == set(MODELS)
        assert classes["detect"]["request_count"] > classes["classify"]["request_count"] > 0
        assert point["error_count"] == 0
        stages = point["server"]["stages"]
        assert set(stages) == set(MODELS)
        assert all(stages[m]["success_count"] > 0 for m in MODELS)
    kept = "best" if summary["recommendation"]["config"] == "best" else "baseline"
    for model in MODELS:  # a drop-in repository tree: one config.pbtxt per model
        config = parse_config_text((run_dir / kept / model / "config.pbtxt").read_text())
        assert config.name == model
    assert "classify p99" in done.stdout
    # The report's per-model table at the operating point names the model nearest its goal.
    report = (run_dir / "report.html").read_text()
    assert "The models served together" in report and "limits capacity" in report
