"""A stateful model tuned: the bundled accumulator's config (``reference_server/zoo/
accumulator.py``, sequence_batching with the oldest strategy) swept closed loop with sequence
streams, behind the planted seams (:mod:`tests.sweep.planted`: the config in memory, each load
level answered by the planted formula). A tiny budget (two trials) and a validation check: every
config the sweep loads and writes is sequence-batched, its ``oldest`` strategy carrying the
searched knobs, with no ``dynamic_batching``; trials meet the goals and the best is recorded.

The virtual server does not simulate the sequence batcher, so this runs on the planted seams.
What the load sends (a START on each sequence's first request, one live sequence per user, the
sums of a correct stream) is pinned on a live server by ``tests/load/test_sequence_load.py``;
the sequence batcher's batches and candidates by ``tests/server/test_sequence.py`` and
``tests/core/test_core_sequence.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.config.scenario import load_scenario
from analyzer.rundir.results import load_summary, load_trial_record, parse_config_text
from analyzer.sweep.loop import run_sweep
from reference_server.zoo.accumulator import accumulator_config
from tests.sweep.planted import FakeLoadGenerator, FakeTarget

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


@pytest.mark.usefixtures("takes_seconds")
def test_a_stateful_model_is_tuned_end_to_end(tmp_path: Path) -> None:
    (tmp_path / "accumulator.toml").write_text(SCENARIO)
    scenario = load_scenario(tmp_path / "accumulator.toml", env={})
    target = FakeTarget(model="accumulator")
    target.current = accumulator_config()
    run_dir = tmp_path / "run"
    run_sweep(scenario, target=target, load=FakeLoadGenerator(target), run_dir=run_dir)
    summary = load_summary(run_dir)
    assert summary["trials"]["complete"] == 2
    assert summary["best"] is not None and summary["best"]["meets_goals"], summary["best"]
    assert summary["best"]["throughput_rps"] > 0
    met = 0
    for n in range(2):
        record = load_trial_record(run_dir / "trials" / f"{n:03d}" / "measurement.json")
        assert record["measurement"]["points"], "the capacity search measured load levels"
        met += bool(record["meets_goals"])
    assert met >= 1
    # Every config the server was given kept the sequence batcher and its oldest strategy.
    assert len(target.loads) >= 3
    for loaded in target.loads:
        assert not loaded.HasField("dynamic_batching")
        assert loaded.sequence_batching.HasField("oldest")
    # The recommended config (best/) and the winner's (best/, or candidate/ when its gain was
    # not significant) are both sequence-batched, the winner's oldest holding its knobs.
    for path in (run_dir / "best" / "config.pbtxt", run_dir / summary["best"]["config_path"]):
        written = parse_config_text(path.read_text())
        assert written.name == "accumulator"
        assert not written.HasField("dynamic_batching")
        assert written.sequence_batching.HasField("oldest")
    best = parse_config_text((run_dir / summary["best"]["config_path"]).read_text())
    knobs = summary["best"]["config"]
    oldest = best.sequence_batching.oldest
    assert oldest.max_queue_delay_microseconds == knobs["max_queue_delay_us"]
    assert best.max_batch_size == knobs["max_batch_size"]
    if "max_candidate_sequences" in knobs:
        assert oldest.max_candidate_sequences == knobs["max_candidate_sequences"]
