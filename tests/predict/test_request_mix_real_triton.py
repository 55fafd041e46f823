"""Predict-then-verify on a real Triton 2.51 with a text classifier fed sentences of mixed length.

The model (:func:`tests.support.real_triton.padded_sequence_model`) takes two INT64 ``[-1]``
inputs (token ids, attention mask) with ragged batching and executes ``6 ms + 0.02 ms * rows *
longest sequence`` per batch, as a transformer pads a batch to its longest member. The load is
a perf_analyzer data file of 40 sentences of 12 to 300 tokens (most of them short, a long tail).
A sweep with ``--search predict`` profiles it with that data (a size class per token-length
quantile), predicts every config of a small space, and measures the predicted best first; a
second one, whose space is one config (max batch size 2), measures a config the first did not.

Acceptance: the simulator's predictions of the measured capacities (each baseline's forecast
and each trial's prediction, as the sweeps recorded them before measuring) are within 20 % of
the measurements (median over the bracketed ones), the predicted best, measured first, within
25 % of its own prediction, and it serves at least what the baseline serves. The profile of
zero-filled length-1 requests the probe took before timed a batch of 8 at 6.7 ms instead of
~30 ms: on this test its first trial was predicted at the space's ceiling, 600 req/s, and
measured 260 (+130 %); later trials, rescaled to the measured windows, came closer.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
from pathlib import Path

import pytest

from analyzer.rundir import records
from analyzer.rundir.results import RunDirectory
from tests.support.real_triton import RealTriton, padded_sequence_model
from tests.support.sweeps import CLI

pytestmark = [pytest.mark.usefixtures("quiet_machine"), pytest.mark.triton, pytest.mark.slow]

MODEL = "textcls_mix"

SCENARIO = """
objective = "throughput"
[model]
name = "{model}"
[input]
data_file = "{data}"
[traffic]
min_rate_rps = 10.0
start_rps = 40.0
max_rate_rps = 600.0
[goals]
p99_ms = 200.0
max_error_rate = 0.01
[space]
max_batch_size = {mbs}
max_queue_delay_us = {delay}
delay_steps = {delay_steps}
preferred_batch_size = "none"
instance_count = [1, 1]
[budget]
trials = {trials}
warmup_s = 0.5
window_s = 0.5
min_requests = 60
capacity_resolution = 0.1
validate_top = 0
[search]
strategy = "predict"
profile_time_s = 30.0
"""

#: The first sweep's space (8 configs; its predicted best is at max batch size 4 or 8), and
#: the second's one config.
WIDE = {"mbs": [1, 8], "delay": [0, 2000], "delay_steps": 2, "trials": 3}
NARROW = {"mbs": [2, 2], "delay": [0, 0], "delay_steps": 1, "trials": 1}


def sentence_lengths(count: int = 40, seed: int = 7) -> list[int]:
    """Token counts of a planted corpus: log-normal (median ~45), 12 to 300, both ends present."""
    rng = random.Random(seed)
    tail = [int(min(300, max(12, math.exp(rng.gauss(3.8, 0.8))))) for _ in range(count - 2)]
    lengths = [12, 300, *tail]
    rng.shuffle(lengths)
    return lengths


def write_data_file(path: Path, lengths: list[int], seed: int = 7) -> None:
    """A perf_analyzer ``--input-data`` file: one entry per sentence (ids and mask)."""
    rng = random.Random(seed)
    entries = [
        {"INPUT_IDS": [rng.randrange(1000, 30000) for _ in range(n)], "ATTENTION_MASK": [1] * n}
        for n in lengths
    ]
    path.write_text(json.dumps({"data": entries}))


def sweep(triton: RealTriton, tmp_path: Path, name: str, space: dict[str, object]) -> Path:
    """One ``perfsweep run --url --search predict`` of the model with the sentences; its run
    directory."""
    scenario = tmp_path / f"{name}.toml"
    scenario.write_text(SCENARIO.format(model=MODEL, data=tmp_path / "sentences.json", **space))
    run_dir = tmp_path / name
    done = subprocess.run(
        [
            *CLI,
            *("run", "--scenario", str(scenario), "--url", f"http://{triton.http_url}"),
            *("--run-dir", str(run_dir)),
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["search_strategy"] == "predict", summary.get("search_note")
    return run_dir


@pytest.mark.timeout(240)
def test_predictions_of_a_mixed_length_load_hold_on_real_triton(
    real_triton: RealTriton, tmp_path: Path
) -> None:
    config, source = padded_sequence_model(MODEL, base_ms=6.0, per_token_ms=0.02)
    real_triton.add_model(config, model_source=source)
    real_triton.load_model(MODEL)
    write_data_file(tmp_path / "sentences.json", sentence_lengths())

    wide = sweep(real_triton, tmp_path, "wide", WIDE)
    profile = json.loads((wide / "profile.json").read_text())
    # Timed at the data's own lengths: the shortest and longest sentence, quantiles between.
    sizes = [c["size"] for c in profile["size_classes"]]
    assert sizes[0] == 12 and sizes[-1] == 300 and len(sizes) >= 3, sizes
    assert profile["mix"]["items"] == 1 and len(profile["mix"]["kinds"]) > 10

    # (trial, predicted, measured, bracketed) of every measured config with a prediction.
    points: list[tuple[str, float, float, bool]] = []
    measured: dict[tuple[str, int], float] = {}
    for run in (wide, sweep(real_triton, tmp_path, "narrow", NARROW)):
        for path in RunDirectory(run).trial_paths():
            record = records.load_trial(path)
            capacity = record.measurement.capacity if record.measurement is not None else None
            if not record.complete or capacity is None:
                continue
            measured[(run.name, record.number)] = capacity.capacity_rps
            if record.prediction is not None:
                points.append(
                    (
                        f"{run.name} {record.number:>2} {record.config.label()}",
                        record.prediction.capacity_rps,
                        capacity.capacity_rps,
                        bool(capacity.bracketed) and capacity.capacity_rps > 0,
                    )
                )
    lines = [
        f"{label:<45} predicted {pred:6.1f} measured {meas:6.1f} req/s error "
        f"{(pred - meas) / meas:+.1%}{'' if bracketed else ' (not bracketed)'}"
        for label, pred, meas, bracketed in points
    ]
    print("\n".join(lines))
    errors = [abs(pred - meas) / meas for _, pred, meas, bracketed in points if bracketed]
    assert len(errors) >= 3, lines
    print(f"median |error| {statistics.median(errors):.1%} over {len(errors)} measurements")
    assert statistics.median(errors) <= 0.20, lines
    # The first config the predictions chose was predicted well and serves at least what the
    # model's own config does.
    baseline, first = measured.get(("wide", -1)), measured.get(("wide", 0))
    assert baseline is not None and first is not None, lines
    print(f"baseline {baseline:.1f} req/s, first measured config {first:.1f} req/s")
    assert first >= baseline, lines
    predicted_first = next(pred for label, pred, _, _ in points if label.startswith("wide  0"))
    assert abs(predicted_first - first) / first <= 0.25, lines
