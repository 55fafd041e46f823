"""A 500-trial run directory renders completely and the file stays reasonable in size.

The run directory is synthetic but written by the real writers: trial records and trials.csv by
``RunDirectory``, the study by ``analyzer.search.study.Search`` (random sampler, journal storage),
the measurements by the planted engine. Timing is printed (``-s``), never asserted.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from analyzer.config.knobs import Knobs
from analyzer.config.model_config import apply_knobs, knobs_of
from analyzer.config.scenario import load_scenario
from analyzer.measure.specs import CapacitySpec, Goals
from analyzer.report import build_record, load_run, write_report
from analyzer.rundir.results import RunDirectory, environment, trial_row, utc_now, write_json
from analyzer.search.study import Search, TrialOutcome
from analyzer.sweep.loop import space_for
from tests.report.conftest import ServerViewLoadGenerator
from tests.sweep.planted import FakeTarget

TRIALS = 500
GOAL_MS = 25.0

pytestmark = pytest.mark.slow


def _write_big_run(root: Path) -> None:
    scenario = load_scenario(
        None,
        {
            "goals.p99_ms": GOAL_MS,
            "space.max_batch_size": [1, 64],
            "space.instance_count": [1, 4],
            "space.delay_steps": 12,
        },
        env={},
    )
    directory = RunDirectory(root)
    root.mkdir(parents=True)
    directory.scenario_toml.write_text(scenario.to_toml())
    directory.write_run_state(
        {
            "run_id": root.name,
            "status": "completed",
            "storage": str(directory.journal),
            "study_name": root.name,
            "scenario_hash": scenario.hash(),
            "started_at": utc_now(),
            "finished_at": utc_now(),
        }
    )
    target = FakeTarget()
    load = ServerViewLoadGenerator(target)
    base = target.model_config()
    spec = CapacitySpec(goals=Goals(GOAL_MS, 0.01), start_rps=10.0, max_rps=5000.0)
    search = Search(space_for(scenario), ["maximize"], str(directory.journal), root.name, "random")

    def measure(number: int, source: str, knobs: Knobs) -> dict:
        config = apply_knobs(base, knobs)
        directory.write_config(number, config)
        target.load_config(config)
        result = load.find_capacity(spec)
        best = result.best
        record = {
            "format_version": 1,
            "kind": "perfsweep.trial",
            "number": number,
            "source": source,
            "state": "complete",
            "config": knobs.to_dict(),
            "throughput_rps": result.capacity_rps,
            "offered_rps": best.target if best else 0.0,
            "p50_ms": best.p50_ms if best else 0.0,
            "p90_ms": best.p90_ms if best else 0.0,
            "p99_ms": best.p99_ms if best else 0.0,
            "error_rate": 0.0,
            "meets_goals": best is not None,
            "constraints": {"p99_slack": (best.p99_ms - GOAL_MS) / GOAL_MS if best else 1.0},
            "failure": None,
            "started_at": utc_now(),
            "duration_s": 1.0,
            "measurement": result.to_dict(),
        }
        write_json(directory.trial_dir(number) / "measurement.json", record)
        directory.trial_rows[number] = trial_row(record)
        return record

    baseline = measure(-1, "baseline", knobs_of(base))
    best = None
    for _ in range(TRIALS):
        asked = search.ask()
        record = measure(asked.number, "search", asked.knobs)
        search.tell(
            asked.number,
            TrialOutcome((record["throughput_rps"],), record["constraints"]),
        )
        if record["meets_goals"] and (
            best is None or record["throughput_rps"] > best["throughput_rps"]
        ):
            best = record
    directory.write_trials_csv()
    assert best is not None
    best_path = directory.write_best(apply_knobs(base, Knobs.from_dict(best["config"])))

    def entry(r: dict, path: str) -> dict:
        return {
            "config": r["config"],
            "throughput_rps": r["throughput_rps"],
            "p50_ms": r["p50_ms"],
            "p99_ms": r["p99_ms"],
            "meets_goals": r["meets_goals"],
            "trial_number": r["number"],
            "config_path": path,
        }

    directory.write_summary(
        {
            "run_id": root.name,
            "model": "planted",
            "device": "sim",
            "target_url": target.url,
            "goals": scenario.goals.model_dump(),
            "objective": "throughput",
            "baseline": entry(baseline, "baseline/config.pbtxt"),
            "best": {
                **entry(best, directory.relative(best_path)),
                "validated_throughput_rps": None,
            },
            "gain": round(best["throughput_rps"] / baseline["throughput_rps"], 3),
            "trials": {"complete": TRIALS, "failed": 0, "total": TRIALS},
            "stop_reason": "trials",
            "pareto": [],
            "validation": [],
            "environment": environment(scenario.hash(), target.describe()),
            "scenario": scenario.to_dict(),
            "files": {},
            "started_at": utc_now(),
            "finished_at": utc_now(),
            "duration_s": 1.0,
        }
    )


def test_500_trials_render(tmp_path: Path) -> None:
    root = tmp_path / "big-run"
    _write_big_run(root)
    started = time.perf_counter()
    out = write_report(root)
    elapsed = time.perf_counter() - started
    size = out.stat().st_size
    print(f"\n500-trial report: {elapsed:.2f} s, {size / 1e6:.2f} MB")

    record = build_record(load_run(root))
    assert len(record.trials) == TRIALS + 1
    assert record.progress.importances is not None
    text = out.read_text()
    # One table row per trial and the baseline: each opens with the trial number's cell.
    rows = re.findall(r'<tr class="[^"]*">\s*<td data-v="-?\d+">', text)
    assert len(rows) == TRIALS + 1
    assert text.count("<figure data-figure=") == 8
    start = text.index('id="perfsweep-data">') + len('id="perfsweep-data">')
    data = json.loads(text[start : text.index("</script>", start)])
    assert len(data["trials"]) == TRIALS + 1
    # "Reasonable": well under what a browser or a CI artifact store minds.
    assert size < 3_000_000
