"""A variable-length model on a real Triton 2.51: batches do not form, the run says why, and
ragged batches make them form.

A Python-backend text classifier (INT64 ``[-1]`` ids and mask) whose execution takes
``12 ms + 0.006 ms x rows x longest sentence``, fed a data file of sentences of 12 to 300 tokens
in random order. Without ``allow_ragged_batch`` Triton batches requests of equal shapes only,
and two neighbours rarely have one: the sweep must say that batches did not form and why. With
``--ragged-batch search`` the answer sets it, says so, and serves at least twice as much,
measured by ``perfsweep load --find-capacity`` with the traffic the recommendation names (the
same data file) on the config each sweep left loaded. What it costs in time to answer, beside
the answer's capacity: ``benchmarks/ragged_text.py``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from analyzer.rundir.results import load_summary, parse_config_text
from tests.support.real_triton import RealTriton, TritonInstall
from tests.support.sweeps import CLI
from tests.support.text_model import (
    padded_sequence_model,
    sentence_lengths,
    text_scenario,
    write_data_file,
)

pytestmark = [pytest.mark.triton, pytest.mark.slow]

MODEL = "textcls"


def sweep_and_measure(
    triton: RealTriton, work: Path, name: str, *flags: str
) -> tuple[dict[str, Any], str, float]:
    """One sweep (one config: max batch 8, two instances) that leaves its answer loaded, then
    that answer's capacity by ``perfsweep load --find-capacity`` with the same data file."""
    data = work / "sentences.json"
    scenario = work / f"{name}.toml"
    scenario.write_text(text_scenario(data, trials=1, wide=False, validate_top=0))
    run_dir = work / name
    done = subprocess.run(
        [
            *CLI,
            *("run", "--scenario", str(scenario), "--url", f"http://{triton.http_url}"),
            *("--run-dir", str(run_dir), "--no-report", "--leave", "best", *flags),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    out = work / f"{name}-capacity.json"
    answer = summary["best"]["throughput_rps"]
    measured = subprocess.run(
        [
            *CLI,
            *("load", "--url", triton.http_url, "--model", MODEL, "--input-data", str(data)),
            *("--find-capacity", "--p99-ms", "200", "--start-rps", f"{0.8 * answer:.1f}"),
            *("--resolution", "0.25", "--window-s", "1", "--warmup-s", "0.5"),
            *("--max-windows", "3", "--no-confirm-failures", "--output", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert measured.returncode == 0, measured.stdout[-3000:] + measured.stderr[-3000:]
    capacity = json.loads(out.read_text())["capacity"]["capacity_rps"]
    return summary, done.stdout, capacity


@pytest.mark.usefixtures("live_sweep")
def test_batches_that_cannot_form_are_explained_and_ragged_batches_serve_twice_as_much(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    config, source = padded_sequence_model(
        MODEL, base_ms=12.0, per_token_ms=0.006, allow_ragged_batch=False
    )
    write_data_file(tmp_path / "sentences.json", sentence_lengths())
    with RealTriton(triton_install, tmp_path / "triton") as triton:
        triton.add_model(config, source)
        triton.load_model(MODEL)
        strict, strict_out, strict_capacity = sweep_and_measure(triton, tmp_path, "strict")
        # The model's own config again, for the second sweep's baseline.
        triton.load_model(MODEL, config)
        ragged, _, ragged_capacity = sweep_and_measure(
            triton, tmp_path, "ragged", "--ragged-batch", "on"
        )
    # Without ragged batches: the run says that batches did not form, and why.
    batching = strict["batching"]
    assert batching["inert"] and batching["same_shape_share"] < 0.2
    assert all(t["mean_batch_size"] < 1.2 for t in batching["trials"])
    assert "batches did not form" in strict_out and "shapes differ" in strict_out
    assert "allow_ragged_batch" in strict_out
    # With them: the answer sets allow_ragged_batch, says so, and its batches form.
    assert ragged["best"]["config"]["ragged_batch"] is True
    assert "allow_ragged_batch" in ragged["recommendation"]["detail"]
    assert not (ragged.get("batching") or {}).get("inert")
    best = (tmp_path / "ragged" / "best" / "config.pbtxt").read_text()
    assert all(i.allow_ragged_batch for i in parse_config_text(best).input)
    # What each answer serves, measured by the load generator with the same traffic.
    assert ragged_capacity >= 2 * strict_capacity, (strict_capacity, ragged_capacity)
