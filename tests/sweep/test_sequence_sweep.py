"""`perfsweep run --model accumulator --device sim` end to end: a stateful model tuned.

The bundled accumulator (``reference_server/zoo/accumulator.py``, sequence_batching with the
oldest strategy) on its simulated device, driven closed loop with correlated sequence streams
(one live sequence per user). A tiny budget (two trials): the test checks that every request
of the sweep is accepted (a missing START would be refused), that trials meet the goals, and
that the best config is a sequence-batched one whose ``oldest`` strategy carries the searched
knobs, with no ``dynamic_batching``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.rundir.results import load_summary, load_trial_record, parse_config_text

pytestmark = [pytest.mark.usefixtures("spawns"), pytest.mark.slow]

SCENARIO = """
objective = "throughput"
[model]
name = "accumulator"
device = "sim"
[traffic]
mode = "concurrency"
max_concurrency = 16
sequence_length = 10
[goals]
p99_ms = 40.0
max_error_rate = 0.01
[space]
max_batch_size = [1, 8]
max_queue_delay_us = [0, 2000]
delay_steps = 2
instance_count = [1, 2]
max_candidate_sequences = [4, 8]
[budget]
trials = 2
patience = 4
warmup_s = 0.3
window_s = 0.6
min_requests = 60
capacity_resolution = 0.3
validate_top = 1
validation = "check"
validate_repeats = 1
validate_window_factor = 1.0
[search]
strategy = "tpe"
"""


def test_a_stateful_model_is_tuned_end_to_end(tmp_path: Path) -> None:
    scenario = tmp_path / "accumulator.toml"
    scenario.write_text(SCENARIO)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from analyzer.cli import main; main()",
            "run",
            "--scenario",
            str(scenario),
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["trials"]["complete"] == 2
    assert summary["best"] is not None and summary["best"]["meets_goals"], summary["best"]
    assert summary["best"]["throughput_rps"] > 0
    met = 0
    for n in range(2):
        record = load_trial_record(run_dir / "trials" / f"{n:03d}" / "measurement.json")
        points = record["measurement"]["points"]
        assert points, "the capacity search measured load levels"
        # Every request carried its sequence: none was refused for a missing START.
        for point in points:
            assert not any("START" in kind for kind in point["errors"]), point["errors"]
        met += bool(record["meets_goals"])
    assert met >= 1
    best = parse_config_text((run_dir / "best" / "config.pbtxt").read_text())
    assert best.name == "accumulator"
    assert not best.HasField("dynamic_batching")
    assert best.sequence_batching.HasField("oldest")
    knobs = summary["best"]["config"]
    oldest = best.sequence_batching.oldest
    assert oldest.max_queue_delay_microseconds == knobs["max_queue_delay_us"]
    assert best.max_batch_size == knobs["max_batch_size"]
    if "max_candidate_sequences" in knobs:
        assert oldest.max_candidate_sequences == knobs["max_candidate_sequences"]
    assert "best config:" in done.stdout
