"""Models served together, tuned together, meet every goal where their solo answers do not.

Each model tuned alone (``perfsweep run --model m``, the device to itself, its own goal) and the
answers applied together, against the models tuned as one (``perfsweep run --mix``, every
model's knobs in one search, each model held to its own goal); both repository trees served by
a fresh server and measured by one instrument, ``perfsweep load`` of the mix.

The models (tests/support/mixes.py): ``rank`` is heavy with a loose goal, so alone two instances
and its largest batches serve the most; beside it ``tag`` has a tight goal, and the device time
``rank``'s two instances spend on small batches is ``tag``'s wait.

- On the reference server (``--device sim``: one simulated device for every instance of every
  model), three models: at the mix's target rate the solo answers miss a goal and the joint one
  meets all three.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.rundir.results import load_summary
from tests.support.mixes import (
    THREE,
    SimServer,
    joint_tree,
    load_mix,
    solo_tree,
)

pytestmark = [pytest.mark.usefixtures("spawns", "quiet_machine"), pytest.mark.slow]

#: The three models' mix rate (every model its share of it), req/s.
TARGET_RPS = 125.0


@pytest.mark.timeout(1200)  # three solo sweeps, one joint sweep, two loads: ~8 minutes
def test_three_models_tuned_together_meet_every_goal_where_their_solo_answers_miss(
    tmp_path: Path,
) -> None:
    server = SimServer()
    repo = server.write(tmp_path / "repo", THREE)
    solo = solo_tree(server, THREE, repo, tmp_path, trials=2, max_rate_rps=1000.0)
    run_dir, joint = joint_tree(server, THREE, repo, tmp_path, trials=8, max_rate_rps=1000.0)

    apart = load_mix(server, THREE, solo, tmp_path / "load-solo", TARGET_RPS)
    together = load_mix(server, THREE, joint, tmp_path / "load-joint", TARGET_RPS)

    assert apart.misses(THREE), f"the solo answers met every goal together: {apart}"
    assert not together.misses(THREE), f"the joint answer missed: {together}"
    summary = load_summary(run_dir)
    assert summary["recommendation"]["config"] == "best"
    # The joint sweep's own capacity of the mix (every model within its goal) covers the target.
    assert summary["best"]["throughput_rps"] >= TARGET_RPS
    assert set(summary["best"]["config"]["stages"]) == set(THREE)
