"""Pipelines on a real Triton 2.51 started by `perfsweep run --server triton`: a three-step
ensemble of Python-backend models (a cheap preprocess, a GPU-like model whose device work is
serialised by a lock every instance shares, a cheap postprocess) and a BLS model that calls two of
them. Every composing model's knobs are searched together while the load goes to the pipeline;
the recommended repository tree (one config.pbtxt per composing model) loads in Triton and serves
at least what the stages tuned one at a time serve.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from analyzer.config.model_config import knobs_of
from analyzer.rundir.results import load_summary, load_trial_record, parse_config_text
from analyzer.target.triton import managed_triton
from tests.support.pipelines import STAGES, Comparison, compare_joint_and_stagewise
from tests.support.pipelines import make_pipeline_repository as make_repository
from tests.support.real_triton import TritonInstall
from tests.support.sweeps import CLI, small_scenario

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def sweep(
    install: TritonInstall, repo: Path, tmp_path: Path, model: str, *extra: str
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    scenario = tmp_path / f"{model}.toml"
    scenario.write_text(small_scenario(2, p99_ms=300.0, max_rate_rps=200.0))
    run_dir = tmp_path / f"run-{model}"
    done = subprocess.run(
        [
            *CLI,
            *("run", "--scenario", str(scenario), "--server", "triton"),
            *("--triton-server-path", str(install.server_bin)),
            *("--model-repository", str(repo), "--model", model, "--run-dir", str(run_dir)),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir, done


def test_an_ensemble_on_triton_is_predicted_tuned_and_its_tree_loads(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path)
    before = {s: (repo / s / "config.pbtxt").read_text() for s in STAGES}
    # Predicted: each composing model is probed on its own, and a probe config that batches
    # less than the ensemble (which Triton then refuses to serve) must not stall the sweep.
    run_dir, _ = sweep(triton_install, repo, tmp_path, "pipe", "--search", "predict")
    summary = load_summary(run_dir)
    assert summary["search_strategy"] == "predict", summary["search_note"]
    assert list(summary["baseline"]["config"]["stages"]) == list(STAGES)
    assert summary["best"]["meets_goals"] and summary["trials"]["complete"] >= 1
    assert {s: (repo / s / "config.pbtxt").read_text() for s in STAGES} == before
    # The chosen configs as a repository tree: each composing model's config.pbtxt dropped
    # into a copy of the repository, and Triton loads the ensemble (and its steps) from it.
    kept = "best" if summary["recommendation"]["config"] == "best" else "baseline"
    tree, knobs = run_dir / kept, summary[kept]["config"]["stages"]
    chosen = tmp_path / "chosen"
    shutil.copytree(repo, chosen)
    for stage in STAGES:
        config = parse_config_text((tree / stage / "config.pbtxt").read_text())
        assert knobs_of(config).to_dict() == knobs[stage]
        shutil.copy(tree / stage / "config.pbtxt", chosen / stage / "config.pbtxt")
    check = managed_triton("pipe", chosen, tmp_path / "check", triton_install.server_bin, 120.0)
    check.start()
    try:
        for stage in STAGES:
            served = check.config_of(stage)
            assert served is not None
            assert knobs_of(served).to_dict() == knobs[stage]
    finally:
        check.stop()


def test_a_bls_model_is_tuned_with_its_named_composing_models(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    repo = make_repository(tmp_path)
    run_dir, done = sweep(triton_install, repo, tmp_path, "bls", "--composing-models", "pre,infer")
    summary = load_summary(run_dir)
    assert list(summary["baseline"]["config"]["stages"]) == ["pre", "infer"]
    record = load_trial_record(run_dir / "trials" / "000" / "measurement.json")
    point = record["measurement"]["best"]
    # The load went to the BLS model; its composing models served its calls. Triton's Python
    # backend records a request's statistics after its response is sent, so the window's last
    # answered requests (at most those in flight at its end) may not be counted yet.
    assert point is not None and point["max_in_flight"] >= 1
    counted = point["server"]["success_count"]
    assert counted >= point["request_count"] - point["max_in_flight"]
    assert "pre: mbs=" in done.stdout and " | infer: mbs=" in done.stdout


@pytest.mark.timeout(1200)  # four sweeps and two capacity searches on Triton: ~10 minutes
def test_the_pipeline_tuned_as_one_serves_at_least_its_stages_tuned_one_at_a_time(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    # The GPU-like stage (20 ms + 4 ms an item on the shared device) limits the pipeline well
    # below this machine's generator ceiling, so the capacities compared are the pipeline's.
    repo = make_repository(tmp_path / "models", device_ms=20.0, per_item_ms=4.0, edge_ms=2.0)
    comparison = Comparison(trials=2, validate_repeats=2, search="predict", rounds=1)
    answers = compare_joint_and_stagewise(triton_install, repo, tmp_path, comparison)
    joint, stagewise = answers["joint"], answers["stagewise"]
    assert load_summary(joint.runs["pipe"])["search_strategy"] == "predict"
    assert all(c > 0 for c in joint.capacity_rps + stagewise.capacity_rps)
    # "At least", as the one instrument can tell: its capacity search brackets each capacity
    # within its resolution, so two trees closer than that measure alike or a step apart.
    assert joint.median_rps >= stagewise.median_rps * (1 - comparison.resolution), (
        joint.capacity_rps,
        stagewise.capacity_rps,
    )
