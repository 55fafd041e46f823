"""`perfsweep run --url` on a real Triton: ensembles calling a stateful model and
sequence-batched models are refused before anything is loaded (exit 2, the model named).

What a sweep of a shared Triton leaves on it is tested live by the secured-Triton sweep
(``test_secured_triton.py``: the original config read back field for field), the sweep's own
rules for it (original, ``--leave best``, after Ctrl-C) on the planted fakes
(``test_lifecycle.py``) and in virtual time; a best config.pbtxt loading in Triton by the managed
Triton's sweep (``test_managed_triton.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from tests.support.real_triton import RealTriton, identity_model_config, sleep_model_config
from tests.support.sweeps import small_scenario

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def served_config(triton: RealTriton, model: str) -> mc.ModelConfig:
    status, payload = triton.http_status("GET", f"/v2/models/{model}/config")
    assert status == 200, payload
    return json_format.Parse(payload, mc.ModelConfig(), ignore_unknown_fields=True)


def sweep_command(
    triton: RealTriton, tmp_path: Path, model: str, run_dir: Path, *extra: str, trials: int = 2
) -> list[str]:
    scenario = tmp_path / "s.toml"
    scenario.write_text(small_scenario(trials, max_rate_rps=400.0))
    return [
        sys.executable,
        "-c",
        "from analyzer.cli import main; main()",
        "run",
        "--scenario",
        str(scenario),
        "--url",
        f"http://{triton.http_url}",
        "--model",
        model,
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def add_sleep_model(triton: RealTriton, name: str) -> mc.ModelConfig:
    triton.add_model(
        sleep_model_config(
            name, max_batch_size=8, execute_delay_ms=4.0, execute_delay_ms_per_item=0.5
        )
    )
    triton.load_model(name)
    return served_config(triton, name)


def _refused(triton: RealTriton, tmp_path: Path, model: str) -> subprocess.CompletedProcess[str]:
    before = served_config(triton, model)
    done = subprocess.run(
        sweep_command(triton, tmp_path, model, tmp_path / "run"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert served_config(triton, model) == before  # nothing was loaded
    assert not (tmp_path / "run" / "run.json").exists()
    return done


def test_a_sequence_batched_model_is_refused(real_triton: RealTriton, tmp_path: Path) -> None:
    config = sleep_model_config("sweep_stateful", max_batch_size=8)
    config.sequence_batching.max_sequence_idle_microseconds = 5_000_000
    real_triton.add_model(config)
    real_triton.load_model("sweep_stateful")
    done = _refused(real_triton, tmp_path, "sweep_stateful")
    assert "sequence-batched" in done.stderr and "tune" in done.stderr


def test_an_ensemble_calling_a_stateful_model_is_refused(
    real_triton: RealTriton, tmp_path: Path
) -> None:
    """An ensemble is tuned as a pipeline; one whose step is sequence-batched is refused with
    exit 2, the step named, before anything is loaded."""
    inner = identity_model_config("sweep_inner")
    inner.sequence_batching.max_sequence_idle_microseconds = 5_000_000
    real_triton.add_model(inner)
    real_triton.load_model("sweep_inner")
    ensemble = mc.ModelConfig(name="sweep_ensemble", platform="ensemble", max_batch_size=8)
    ensemble.input.extend(inner.input)
    ensemble.output.extend(inner.output)
    step = ensemble.ensemble_scheduling.step.add(model_name="sweep_inner", model_version=-1)
    step.input_map["INPUT0"] = inner.input[0].name
    step.output_map["OUTPUT0"] = inner.output[0].name
    real_triton.add_model(ensemble, model_source="")
    real_triton.load_model("sweep_ensemble")
    done = _refused(real_triton, tmp_path, "sweep_ensemble")
    said = " ".join(done.stderr.split())
    assert "step 1 of ensemble 'sweep_ensemble' calls 'sweep_inner', a sequence-batched" in said
    assert served_config(real_triton, "sweep_inner") is not None
