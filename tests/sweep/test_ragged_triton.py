"""A variable-length model on a real Triton 2.51: batches do not form, the run says why, and
ragged batches make them form.

A Python-backend text classifier (INT64 ``[-1]`` ids and mask) whose execution takes
``12 ms + 0.006 ms x rows x longest sentence``, fed a data file of sentences of 12 to 300 tokens
in random order. Without ``allow_ragged_batch`` Triton batches requests of equal shapes only,
and two neighbours rarely have one: the sweep must say that batches did not form and why. With
``--ragged-batch on`` the answer sets it, says so, and batches form. What the answer serves,
and what it costs in time to answer: ``benchmarks/ragged_text.py``.
"""

from __future__ import annotations

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


def sweep(triton: RealTriton, work: Path, name: str, *flags: str) -> tuple[dict[str, Any], str]:
    """One sweep (one config: max batch 8, two instances): its summary and console."""
    data = work / "sentences.json"
    scenario = work / f"{name}.toml"
    scenario.write_text(text_scenario(data, trials=1, wide=False, validate_top=0))
    run_dir = work / name
    done = subprocess.run(
        [
            *CLI,
            *("run", "--scenario", str(scenario), "--url", f"http://{triton.http_url}"),
            *("--run-dir", str(run_dir), "--no-report", *flags),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return load_summary(run_dir), done.stdout


@pytest.mark.usefixtures("live_sweep")
def test_batches_that_cannot_form_are_explained_and_ragged_batches_let_them_form(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    config, source = padded_sequence_model(
        MODEL, base_ms=12.0, per_token_ms=0.006, allow_ragged_batch=False
    )
    write_data_file(tmp_path / "sentences.json", sentence_lengths())
    with RealTriton(triton_install, tmp_path / "triton") as triton:
        triton.add_model(config, source)
        triton.load_model(MODEL)
        strict, strict_out = sweep(triton, tmp_path, "strict")
        ragged, _ = sweep(triton, tmp_path, "ragged", "--ragged-batch", "on")
    # Without ragged batches: the run says that batches did not form, and why.
    batching = strict["batching"]
    assert batching["inert"] and batching["same_shape_share"] < 0.2
    assert all(t["mean_batch_size"] < 1.2 for t in batching["trials"])
    assert "batches did not form" in strict_out and "shapes differ" in strict_out
    assert "allow_ragged_batch" in strict_out
    # With them: the answer sets allow_ragged_batch, says so, and its batches form.
    assert ragged["best"]["config"]["ragged_batch"] is True
    assert "allow_ragged_batch" in ragged["recommendation"]["detail"]
    assert not ragged["batching"]["inert"]
    best = (tmp_path / "ragged" / "best" / "config.pbtxt").read_text()
    assert all(i.allow_ragged_batch for i in parse_config_text(best).input)
    formed = ragged["batching"]["trials"]
    assert formed and all(t["mean_batch_size"] > 1.5 for t in formed), formed
