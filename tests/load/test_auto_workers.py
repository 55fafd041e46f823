"""``traffic.workers = "auto"``: the generator adds processes when its self-check says it is the
bottleneck, measures the level again, and keeps them for later levels.

The child (``python -m tests.load.test_auto_workers``, the engine is gevent code) serves a
simulated 2 ms model and measures it through ``engine_options`` from a scenario with
``workers = "auto"``:

* with the self-check's usual limits, 20 req/s is offered by one process: nothing grows;
* with a planted limit no generator can meet (CPU above -1 % of a core is "saturated"), the
  first level is measured with 1 process, found saturated, and measured again with 2 (the bound
  planted here; by default one per core); a second level starts with the 2 processes and does
  not grow further. The measurement says so in its messages.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from analyzer.config.scenario import generator_overrides, load_scenario
from analyzer.load.engine import engine_options, usable_cores
from tests.load.child import run_module


def test_auto_starts_with_one_process_and_may_grow_to_one_per_core() -> None:
    scenario = load_scenario(None, {"traffic.workers": "auto"}, env={})
    options = engine_options(scenario, "127.0.0.1:1", "m", distributed=True)
    assert (options.workers, options.max_workers) == (1, usable_cores())
    fixed = load_scenario(None, generator_overrides(workers="3"), env={})
    options = engine_options(fixed, "127.0.0.1:1", "m", distributed=True)
    assert (options.workers, options.max_workers) == (3, 0)


def test_a_workers_value_that_is_neither_a_count_nor_auto_is_refused() -> None:
    from analyzer.errors import InputError

    with pytest.raises(InputError, match="neither a count nor auto"):
        generator_overrides(workers="many")


@pytest.fixture(scope="module")
def answer(spawns: None) -> dict[str, Any]:
    return run_module("tests.load.test_auto_workers", timeout_s=240.0)


def test_a_generator_that_keeps_up_stays_at_one_process(answer: dict[str, Any]) -> None:
    m = answer["keeps_up"]
    assert m["valid"], m["messages"]
    assert m["workers"] == 1
    assert not any("grown" in note for note in m["messages"])


def test_a_saturated_generator_grows_and_measures_the_level_again(
    answer: dict[str, Any],
) -> None:
    first, second = answer["saturated"]
    assert first["workers"] == 2  # the level's answer comes from the grown generator
    assert any("grown from 1 to 2 processes" in note for note in first["messages"])
    assert first["request_count"] > 0
    # Later levels keep the processes; at the bound nothing grows any more.
    assert second["workers"] == 2
    assert not any("grown" in note for note in second["messages"])
    assert not second["valid"]  # the planted limit still says saturated, and the result says so


def main() -> None:
    """Child side: serve the model, measure with auto workers, print the measurements."""
    from dataclasses import replace

    from analyzer.load import LocustLoadGenerator
    from analyzer.measure.specs import LoadMode, LoadSpec
    from tests.load.refserver import RefServer, write_sim_model

    repo = Path(tempfile.mkdtemp(prefix="perfsweep-auto-workers-"))
    write_sim_model(repo, "m", 2.0)
    scenario = load_scenario(None, {"traffic.workers": "auto"}, env={})
    spec = LoadSpec(
        LoadMode.REQUEST_RATE, 20.0, warmup_s=0.3, window_s=1.0, stable_windows=2, max_windows=2
    )
    answer: dict[str, Any] = {}
    with RefServer(repo, ("m",)) as srv:
        url = f"http://{srv.http_url}"
        options = engine_options(scenario, url, "m", metrics_url=srv.metrics_url, distributed=True)
        with LocustLoadGenerator(options) as generator:
            answer["keeps_up"] = generator.measure(spec).to_dict()
        planted = replace(options, max_workers=2, max_cpu_pct=-1.0)
        with LocustLoadGenerator(planted) as generator:
            answer["saturated"] = [generator.measure(spec).to_dict() for _ in range(2)]
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    sys.exit(main())
