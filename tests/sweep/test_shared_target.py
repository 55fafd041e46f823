"""Two workers of one study on one shared server (``model.url``): the second is refused before it
loads anything, and a finished worker's released lease lets the next one in (fake target and
load, a shared journal study: milliseconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.config.objective import objective_for
from analyzer.config.scenario import Scenario, load_scenario
from analyzer.search.study import Search
from analyzer.sweep.loop import run_sweep, space_for
from analyzer.target.leases import TargetInUseError, claim_target, release_target
from tests.sweep.planted import FakeLoadGenerator, FakeTarget


def scenario(tmp_path: Path, out: str) -> Scenario:
    return load_scenario(
        None,
        {
            "model.url": FakeTarget.url,
            "model.name": FakeTarget.model,
            "space.max_batch_size": [1, 8],
            "space.instance_count": [1, 2],
            "traffic.max_rate_rps": 5000.0,
            "budget.trials": 2,
            "budget.validate_top": 0,
            "search.strategy": "tpe",
            "run.storage": str(tmp_path / "shared.journal"),
            "run.study_name": "shared",
            "run.output_dir": str(tmp_path / out),
        },
        env={},
    )


@pytest.mark.usefixtures("takes_seconds")
def test_a_second_worker_on_the_same_url_is_refused_and_loads_nothing(tmp_path: Path) -> None:
    first = scenario(tmp_path, "w0")
    other = Search(
        space_for(first),
        objective_for(first.objective).directions,
        storage=first.run.storage or "",
        study_name="shared",
    )
    held = claim_target(other, FakeTarget.url, FakeTarget.model)  # a live worker holds it
    target = FakeTarget(shared=True)  # a --url server, as make_target gives it
    with pytest.raises(TargetInUseError, match="another perfsweep worker of this study"):
        run_sweep(scenario(tmp_path, "w1"), target=target, load=FakeLoadGenerator(target))
    assert target.loads == [], "the refused worker loaded no config"
    release_target(other, held)  # that worker finished: the next one goes on
    outcome = run_sweep(scenario(tmp_path, "w2"), target=target, load=FakeLoadGenerator(target))
    assert outcome.stop_reason == "trials"
    # Its own lease is released at the end: a third worker is not refused.
    run_sweep(scenario(tmp_path, "w3"), target=target, load=FakeLoadGenerator(target))
