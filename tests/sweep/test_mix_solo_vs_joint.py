"""Three models served together, tuned together, meet every goal where their solo answers do not.

Each model tuned alone (``perfsweep run --model m``, the device to itself, its own goal) and the
three answers applied together, against the three tuned as one (``perfsweep run --mix``, every
model's knobs in one search, each model held to its own goal); both repository trees served by
a fresh reference server (``--device sim``: one simulated device for every instance of every
model) and measured by one instrument, ``perfsweep load`` of the mix at its target rate.

The models (tests/support/mixes.py): ``rank`` is heavy with a loose goal, so alone its largest
batches serve the most; beside it ``tag`` has a tight goal, and a batch of ``rank``'s solo size
holds the shared device longer than ``tag`` may wait.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.rundir.results import load_summary
from tests.support.mixes import MODELS, joint_tree, load_mix, solo_trees, write_mix_repository

pytestmark = [pytest.mark.usefixtures("spawns"), pytest.mark.slow]

#: The mix's target rate (every model's share of it), req/s.
TARGET_RPS = 125.0


@pytest.mark.timeout(1200)  # three solo sweeps, one joint sweep, two loads: ~8 minutes
def test_three_models_tuned_together_meet_every_goal_where_their_solo_answers_miss(
    tmp_path: Path,
) -> None:
    repo = write_mix_repository(tmp_path / "repo")
    solo = solo_trees(repo, tmp_path, trials=2, max_rate_rps=1000.0)
    run_dir, joint = joint_tree(repo, tmp_path, trials=8, max_rate_rps=1000.0)

    apart = load_mix(solo, tmp_path / "load-solo", TARGET_RPS)
    together = load_mix(joint, tmp_path / "load-joint", TARGET_RPS)

    assert apart.misses(), f"the solo answers met every goal together: {apart}"
    assert not together.misses(), f"the joint answer missed: {together}"
    summary = load_summary(run_dir)
    assert summary["recommendation"]["config"] == "best"
    # The joint sweep's own capacity of the mix (every model within its goal) covers the target.
    assert summary["best"]["throughput_rps"] >= TARGET_RPS
    assert set(summary["best"]["config"]["stages"]) == set(MODELS)
