"""`perfsweep run --url` tunes a Python-backend model on a real Triton, and the
best/config.pbtxt it writes loads on that Triton unchanged (as the model's config file).

A shared server is left on the model's original config at the end (read back from Triton),
after Ctrl-C too, or on the winner with ``--leave best``; ensembles and sequence-batched models
are refused before anything is loaded."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from analyzer.config.knobs import Knobs
from analyzer.config.model_config import knobs_of
from analyzer.rundir.results import load_summary, parse_config_text
from tests.support.real_triton import RealTriton, identity_model_config, sleep_model_config
from tests.support.servers import wait_until
from tests.support.sweeps import small_scenario

pytestmark = [pytest.mark.triton, pytest.mark.slow]

MODEL = "sweep_sleep"


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


def test_sweep_a_real_triton_and_load_the_best_config(
    real_triton: RealTriton, tmp_path: Path
) -> None:
    original = add_sleep_model(real_triton, MODEL)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        sweep_command(real_triton, tmp_path, MODEL, run_dir),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["device"] == "remote" and summary["trials"]["total"] == 2
    assert summary["environment"]["target"]["server"] == "triton"
    assert summary["baseline"]["config"]["dynamic_batching"] is False
    assert summary["best"] is not None, done.stdout[-3000:]
    # The winner's file: best/config.pbtxt, or candidate/config.pbtxt when its gain is not
    # significant (best/config.pbtxt then holds the model's own config).
    best_path = run_dir / summary["best"]["config_path"]
    best = parse_config_text(best_path.read_text())
    # The shared server holds the model's original config again, field for field.
    assert served_config(real_triton, MODEL) == original
    assert summary["left_on_server"]["config"] == "original"
    assert "server left with: restored the model's original config" in done.stdout

    # Drop the file in as the model's own config.pbtxt and load it without any override.
    (real_triton.repository / MODEL / "config.pbtxt").write_text(best_path.read_text())
    real_triton.load_model(MODEL)
    status, payload = real_triton.http_status("GET", f"/v2/models/{MODEL}/config")
    assert status == 200
    served = json_format.Parse(payload, mc.ModelConfig(), ignore_unknown_fields=True)
    assert knobs_of(served) == knobs_of(best) == Knobs.from_dict(summary["best"]["config"])
    assert (
        served.parameters["execute_delay_ms"].string_value
        == best.parameters["execute_delay_ms"].string_value
    )


def test_predict_search_profiles_a_real_triton(real_triton: RealTriton, tmp_path: Path) -> None:
    # The default search against Triton itself: the profile phase reads Triton's batch_stats,
    # the simulator ranks the space, the measured trials are the predicted ones, and the
    # shared server gets its original config back.
    name = "sweep_sleep_predict"
    original = add_sleep_model(real_triton, name)
    run_dir = tmp_path / "run"
    command = sweep_command(real_triton, tmp_path, name, run_dir, "--search", "predict", trials=3)
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["search_strategy"] == "predict", summary.get("search_note")
    assert {"baseline", "profile", "predict"} <= set(summary["phases"])
    predictions = json.loads((run_dir / "predictions.json").read_text())
    assert predictions["kind"] == "perfsweep.predictions" and len(predictions["configs"]) >= 4
    trials = [
        json.loads(p.read_text()) for p in sorted((run_dir / "trials").glob("*/measurement.json"))
    ]
    assert trials and all(t["source"] == "predict" and t["prediction"] for t in trials)
    assert served_config(real_triton, name) == original


def test_leave_best_leaves_the_winner_loaded(real_triton: RealTriton, tmp_path: Path) -> None:
    model = "sweep_sleep_best"
    original = add_sleep_model(real_triton, model)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        sweep_command(real_triton, tmp_path, model, run_dir, "--leave", "best", trials=1),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["best"] is not None, done.stdout[-3000:]
    winner = Knobs.from_dict(summary["best"]["config"])
    served = served_config(real_triton, model)
    recommended = knobs_of(parse_config_text((run_dir / "best" / "config.pbtxt").read_text()))
    # --leave best leaves what best/config.pbtxt holds: the winner when its gain is
    # significant, else the model's own config (the winner is then only a candidate).
    assert knobs_of(served) == recommended
    if summary["recommendation"]["config"] == "best":
        assert recommended == winner
    assert summary["left_on_server"]["config"] == "best"
    assert Knobs.from_dict(summary["left_on_server"]["knobs"]) == winner
    # Everything but the searched knobs is the model's own.
    assert served.parameters == original.parameters and served.input == original.input


def test_ctrl_c_leaves_the_original_config(real_triton: RealTriton, tmp_path: Path) -> None:
    model = "sweep_sleep_sigint"
    original = add_sleep_model(real_triton, model)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        sweep_command(real_triton, tmp_path, model, run_dir, trials=4),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def running() -> None:
        assert proc.poll() is None, proc.communicate()[0][-3000:]

    try:
        deadline = time.monotonic() + 240
        wait_until(
            lambda: running() or (run_dir / "trials" / "000" / "measurement.json").exists(),
            240,
            "trial 0 to finish",
        )
        # Trial 1 loads another config: interrupt once the server holds something else.
        wait_until(
            lambda: running() or knobs_of(served_config(real_triton, model)) != knobs_of(original),
            max(deadline - time.monotonic(), 0.0),
            "a trial config to be loaded",
        )
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, output[-3000:]
    assert served_config(real_triton, model) == original
    summary = load_summary(run_dir)
    assert summary["stop_reason"] == "interrupted"
    assert summary["left_on_server"]["config"] == "original"
    assert "server left with: restored the model's original config" in output


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
