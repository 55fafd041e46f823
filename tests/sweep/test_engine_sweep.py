"""A generative engine tuned live: its configs reach the server through the repository load
with the engine file beside ``config``, or through restarts of a server started from a command.

The command target restarts the bundled ``tinyllm`` on the reference engine (``python -m
reference_server --engine-setting KEY=VALUE`` takes vLLM's settings on its command line as
``vllm serve`` takes flags; vLLM itself: ``tests/engines/test_tune_vllm.py``). The live sweep
tunes a vLLM model on a real Triton through the repository API. Assertions are on what was
loaded and recorded (configs, files, restarts, counts) and on a capacity ratio with a wide
margin, never on wall-clock times.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.config.knobs import EngineKnobs
from analyzer.config.pipeline import Tuned
from analyzer.config.scenario import load_scenario
from analyzer.rundir.results import RunDirectory, load_summary
from analyzer.target.command import CommandTarget
from tests.load.refserver import REPO_ROOT
from tests.support.real_triton import RealTriton, TritonInstall
from tests.support.servers import write_model
from tests.support.stream_model import install_vllm_backend, stream_model_config, stub_numpy1

CLI = [sys.executable, "-c", "from analyzer.cli import main; main()"]
SERVE = (
    f"{sys.executable} -m reference_server --model tinyllm --device sim --http-port {{port}} "
    "--grpc-port 0 --metrics-port 0 --engine-setting max_num_seqs={max_num_seqs} "
    "--engine-setting max_num_batched_tokens={max_num_batched_tokens}"
)


def test_a_command_target_restarts_its_server_only_for_a_new_config(
    spawns: None, tmp_path: Path
) -> None:
    target = CommandTarget(SERVE, "tinyllm", "vllm", tmp_path / "server.log")
    base = target.model_config()
    assert base.backend == "vllm" and base.model_transaction_policy.decoupled
    tuned = Tuned(base, engine="vllm")
    try:
        target.start()
        assert target.starts == 1 and target.knobs == tuned.knobs()
        knobs = EngineKnobs(4, 512)
        (config,) = tuned.configs(knobs)
        target.load_config(config, files=tuned.files(knobs))
        assert target.starts == 2 and target.knobs == EngineKnobs(4, 512)
        target.load_config(config, files=tuned.files(knobs))  # already running: no restart
        assert target.starts == 2
        target.ensure_alive()
        assert target.restarts == 0
        log = (tmp_path / "server.log").read_text()
        assert "max_num_seqs=4 --engine-setting max_num_batched_tokens=512" in log
        assert target.command_line(knobs).endswith(
            "--engine-setting max_num_seqs=4 --engine-setting max_num_batched_tokens=512"
        )
    finally:
        target.stop()


@pytest.mark.parametrize("goal", ["ttft", "none"])
def test_token_goals_belong_to_generative_models(goal: str, tmp_path: Path) -> None:
    from analyzer.config.scenario import Scenario
    from analyzer.errors import InputError
    from analyzer.sweep.loop import streaming_scenario

    scenario = load_scenario(None, {"goals.ttft_p99_ms": 100.0} if goal == "ttft" else {}, env={})
    assert isinstance(scenario, Scenario)
    base = CommandTarget.__new__(CommandTarget)
    base.model, base.engine = "llm", "vllm"
    config = base.model_config()
    if goal == "none":
        with pytest.raises(InputError, match="--ttft-p99-ms"):
            streaming_scenario(scenario, config)
        return
    assert streaming_scenario(scenario, config).model.protocol == "generate-stream"


TRITON_SCENARIO = """
objective = "throughput"
[model]
name = "llm"
[traffic]
input_tokens = "16"
output_tokens = "16"
min_rate_rps = 1.0
start_rps = 4.0
max_rate_rps = 16.0
[goals]
ttft_p99_ms = 400.0
itl_p99_ms = 100.0
[space]
max_num_seqs = [1, 4]
max_num_batched_tokens = [2048]
[budget]
trials = 2
warmup_s = 0.3
window_s = 0.5
min_requests = 4
capacity_resolution = 0.5
validate_top = 0
[search]
strategy = "grid"
"""


@pytest.mark.triton
def test_a_vllm_model_on_triton_is_tuned_through_the_repository_api_and_put_back(
    live_sweep: None, triton_install: TritonInstall, tmp_path: Path
) -> None:
    """A real Triton 2.51 serves ``llm`` with ``backend: "vllm"``: the streaming model of
    ``tests/support/stream_model.py`` installed as the Python-based backend ``vllm``, its running
    set (``max_num_seqs``) read from ``1/model.json`` as Triton's vLLM backend reads its engine
    args. ``perfsweep run --url`` tunes it: each trial loads the model through the repository
    API with its ``file:1/model.json`` beside the config, and at the end the original (the file
    on disk, ``max_num_seqs`` 2) is loaded again. Every load is read from the model's own log
    line, ``engine max_num_seqs=<n>``, in Triton's log."""
    try:
        numpy1 = stub_numpy1(tmp_path / "stub_numpy1")
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no numpy 1 for the Python-backend stub's BYTES tensors: {exc}")
    triton = RealTriton(triton_install, tmp_path / "triton", cwd=numpy1)
    triton.start()
    try:
        install_vllm_backend(triton.workdir / "backends")
        config = stream_model_config("llm", first_token_ms=20.0, token_ms=10.0)
        config.backend = "vllm"
        on_disk = json.dumps({"model": "llm", "max_num_seqs": 2}) + "\n"
        model_dir = write_model(triton.repository, "llm", config)
        (model_dir / "1" / "model.json").write_text(on_disk)
        triton.load_model("llm")
        scenario = tmp_path / "llm.toml"
        scenario.write_text(TRITON_SCENARIO)
        done = subprocess.run(
            [
                *CLI,
                *("run", "--scenario", str(scenario), "--url", f"http://{triton.http_url}"),
                *("--output-dir", str(tmp_path / "runs")),
            ],
            capture_output=True,
            text=True,
            timeout=400,
            cwd=REPO_ROOT,
        )
        log = triton.log_path.read_text(errors="replace")
    finally:
        triton.stop()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "TTFT p99" in done.stdout and "tok/s" in done.stdout  # the trial lines
    loads = [int(n) for n in re.findall(r"engine max_num_seqs=(\d+)", log)]
    # At start, the two trials' files (in the grid's order), then the original put back.
    assert loads[0] == 2 and loads[-1] == 2, loads
    assert loads.index(1) < loads.index(4), loads
    assert (triton.repository / "llm" / "1" / "model.json").read_text() == on_disk
    (run_dir,) = (tmp_path / "runs").iterdir()
    records = RunDirectory(run_dir).load_existing_trials()
    trials = {r.config.max_num_seqs: r for r in records if r.number >= 0}
    assert set(trials) == {1, 4}
    for r in trials.values():
        figures = r.token_figures()
        assert figures and figures["ttft_p99_ms"] and figures["output_tokens_per_s"]
    # One sequence at a time serves 1 / (20 ms + 15 x 10 ms) = 5.9 req/s at most; four at once,
    # four times that, above the space's ceiling of 16 req/s.
    assert trials[4].throughput_rps > 1.5 * trials[1].throughput_rps
    summary = load_summary(run_dir)
    assert summary["best"]["config"]["max_num_seqs"] == 4
    assert summary["best"]["tokens"]["ttft_p99_ms"] > 0
    best = run_dir / "best"
    measured = json.loads((best / "measured.json").read_text())
    if summary["recommendation"]["config"] == "best":  # significantly better: its engine file
        written = json.loads((best / "model.json").read_text())
        assert written["max_num_seqs"] == 4
        assert measured["config"]["max_num_seqs"] == 4
    else:  # no searched config significantly better: the model's own engine, as measured
        assert not (best / "model.json").exists() and measured["trial"] == -1
