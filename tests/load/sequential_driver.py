"""Child side of ``tests/load/test_sequential.py``: one sequential capacity search, as JSON.

``python -m tests.load.sequential_driver`` with a JSON spec on stdin: ``model`` (kwargs of
``write_sim_model`` minus the repository), ``searches`` (a list of ``CapacitySpec`` fields; each
``step`` holds ``LoadSpec`` fields and ``sequential`` the ``StepTest`` fields). It starts a
reference server (``RefServer``), runs ``LocustLoadGenerator.find_capacity`` for each search, and
prints ``{"searches": [result.to_dict(), ...]}`` on its last stdout line. Kept apart from
``tests.load.driver`` so that driver's spec stays as it is.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def main() -> None:
    """Read the spec, run the search, print the answer."""
    spec = json.loads(sys.stdin.read())

    from analyzer.load import EngineOptions, LocustLoadGenerator
    from analyzer.measure.arrivals import parse_arrival
    from analyzer.measure.specs import CapacitySpec, Goals, LoadMode, LoadSpec
    from analyzer.measure.stepping import StepTest
    from tests.load.refserver import RefServer, write_sim_model

    repo = Path(tempfile.mkdtemp(prefix="perfsweep-seq-"))
    model = spec["model"]
    write_sim_model(repo, **model)
    searches = []
    for raw in spec["searches"]:
        cap = dict(raw)
        step = dict(cap["step"])
        step["mode"] = LoadMode(step["mode"])
        step["arrival"] = parse_arrival(step.get("arrival", "poisson"))
        step["sequential"] = StepTest(**step["sequential"])
        cap["step"] = LoadSpec(**step)
        cap["goals"] = Goals(**cap["goals"])
        searches.append(CapacitySpec(**cap))
    answer = []
    with RefServer(repo, (model["name"],)) as srv:
        # The sweep's rule for a saturated generator (analyzer/sweep/loop.py): a send lag of a tenth
        # of the goal cannot flip a verdict, so only more than that makes a step invalid.
        lag_ms = max(10.0, 0.1 * min(s.goals.p99_ms for s in searches))
        options = EngineOptions(
            url=srv.http_url,
            model=model["name"],
            metrics_url=srv.metrics_url,
            max_send_lag_ms=lag_ms,
        )
        with LocustLoadGenerator(options) as generator:
            for search in searches:
                answer.append(generator.find_capacity(search).to_dict())
    print(json.dumps({"searches": answer}), flush=True)


if __name__ == "__main__":
    main()
