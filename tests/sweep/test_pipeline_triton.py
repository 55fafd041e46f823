"""Pipelines on a real Triton 2.51 started by `perfsweep run --server triton`: a three-step
ensemble of Python-backend models (a cheap preprocess, a GPU-like model whose device work is
serialised by a lock every instance shares, a cheap postprocess). Every composing model's knobs
are searched together while the load goes to the pipeline; the recommended repository tree (one
config.pbtxt per composing model) loads in Triton. (What it serves beside the stages tuned one at
a time: benchmarks/pipeline_vs_stagewise.py.)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from analyzer.config.model_config import knobs_of
from analyzer.rundir.results import load_summary, parse_config_text
from analyzer.target.triton import managed_triton
from tests.support.pipelines import STAGES
from tests.support.pipelines import make_pipeline_repository as make_repository
from tests.support.real_triton import TritonInstall
from tests.support.sweeps import CLI, small_scenario

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def sweep(
    install: TritonInstall, repo: Path, tmp_path: Path, model: str, *extra: str
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    scenario = tmp_path / f"{model}.toml"
    scenario.write_text(small_scenario(2, p99_ms=300.0, max_rate_rps=200.0, validate_top=0))
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


@pytest.mark.usefixtures("live_sweep")
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
