"""`perfsweep run` end to end on a real reference server (simulated device) and real Locust.

A small simulated model (16 floats in, the bundled GPU-like latency profile) keeps requests
cheap, so the generator on a 2-core machine is not the bottleneck. Budgets are tiny: these tests
check the plumbing (subprocess server, repository loads, run directory, resume after SIGKILL),
not the quality of the answer (the planted-optimum tests do that).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.rundir.results import load_summary, load_trial_record, parse_config_text
from reference_server.core.config import validate
from reference_server.ready import last_ready
from tests.support.servers import (
    free_port,
    process_gone,
    remote_load_worker,
    supervised_pid,
    wait_until,
    write_model,
)

pytestmark = [pytest.mark.usefixtures("spawns"), pytest.mark.slow]

CLI = [sys.executable, "-c", "from analyzer.cli import main; main()"]

SCENARIO = """
objective = "throughput"
[model]
name = "tiny"
[traffic]
min_rate_rps = 5.0
start_rps = 40.0
max_rate_rps = 400.0
[goals]
p99_ms = 150.0
max_error_rate = 0.01
[space]
max_batch_size = [1, 16]
max_queue_delay_us = [0, 4000]
delay_steps = 3
instance_count = [1, 2]
[budget]
trials = {trials}
patience = 10
warmup_s = 0.3
window_s = 0.5
min_requests = 60
capacity_resolution = 0.3
validate_top = {validate_top}
validate_repeats = 1
validate_window_factor = 1.0
[search]
strategy = "{strategy}"
"""

MODEL_CONFIG = """
name: "tiny"
backend: "simulated"
max_batch_size: 16
input { name: "x" data_type: TYPE_FP32 dims: [16] }
output { name: "y" data_type: TYPE_FP32 dims: [4] }
instance_group { count: 1 kind: KIND_CPU }
parameters { key: "profile" value { string_value: "resnet50_sim" } }
"""


def make_repo(root: Path) -> Path:
    write_model(root / "repo", "tiny", MODEL_CONFIG)
    return root / "repo"


def command(
    tmp_path: Path,
    trials: int,
    run_dir: Path,
    validate_top: int = 1,
    strategy: str = "tpe",
) -> list[str]:
    """The ``perfsweep run`` command line. The plumbing tests search with tpe (a fixed number
    of trials, resumable mid-trial); ``--search predict`` has its own test below."""
    scenario = tmp_path / f"tiny-{trials}-{strategy}.toml"
    scenario.write_text(
        SCENARIO.format(trials=trials, validate_top=validate_top, strategy=strategy)
    )
    return [
        sys.executable,
        "-c",
        "from analyzer.cli import main; main()",
        "run",
        "--scenario",
        str(scenario),
        "--model-repository",
        str(make_repo(tmp_path)),
        "--model",
        "tiny",
        "--device",
        "sim",
        "--run-dir",
        str(run_dir),
    ]


def test_sweep_over_grpc_on_simulated_device_writes_a_loadable_best_config(
    tmp_path: Path,
) -> None:
    """A whole sweep (baseline, trials, validation) over gRPC: it reaches the managed server's
    gRPC port, and what it writes is what an HTTP sweep writes. The other sweeps of this module
    send HTTP, the default."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [*command(tmp_path, 2, run_dir), "--protocol", "grpc"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["scenario"]["model"]["protocol"] == "grpc"
    # The device is the server's own report (perfsweep_model_device_info), not the flag.
    assert summary["device"] == "sim" and summary["devices"], summary["devices"]
    assert {d["backend"] for d in summary["devices"]} == {"simulated"}
    assert summary["trials"]["complete"] == 2
    assert summary["validation"], "the best config and the baseline were re-measured"
    assert summary["baseline"]["throughput_rps"] > 0
    assert summary["best"]["meets_goals"] and summary["best"]["throughput_rps"] > 0
    best = parse_config_text((run_dir / "best" / "config.pbtxt").read_text())
    validate(best)  # the reference server's Triton-rule validation accepts it
    assert (
        best.name == "tiny" and best.max_batch_size == summary["best"]["config"]["max_batch_size"]
    )
    assert best.parameters["profile"].string_value == "resnet50_sim"
    operating = []
    for n in range(2):
        record = load_trial_record(run_dir / "trials" / f"{n:03d}" / "measurement.json")
        assert record["measurement"]["points"], "the capacity search measured load levels"
        if record["measurement"]["best"] is not None:
            operating.append(record["measurement"]["best"])
    # At each trial's operating point every request the generator counted reached the server
    # (its statistics agree).
    assert operating, "no trial had an operating point"
    for point in operating:
        assert (
            point["error_count"] == 0 and point["server"]["success_count"] >= point["request_count"]
        )
    assert "ready" in (run_dir / "server" / "server.log").read_text()
    assert "best config:" in done.stdout and "gain over baseline" in done.stdout
    # The suite renders no report it does not read (PERFSWEEP_RUN_REPORT=false, as a pipeline
    # that reads summary.json only would): the run says so and where to render it.
    assert not (run_dir / "report.html").exists() and summary["files"]["report"] is None
    assert f"report:       not rendered (perfsweep report {run_dir})" in done.stdout
    # A log (stdout is a pipe here): a plain line per trial as it starts and ends, with the time.
    lines = done.stdout.splitlines()
    for n in range(2):
        assert any(re.match(rf"\[ *\d+ s\] trial {n} \(.*\): .*measuring$", x) for x in lines)
        assert any(re.match(rf"\[ *\d+ s\] trial {n}: .* req/s, p99 ", x) for x in lines)
    assert any(re.match(r"\[ *\d+ s\] baseline: .* req/s", x) for x in lines), lines[:10]


def test_search_predict_on_simulated_device(tmp_path: Path) -> None:
    """The profile phase probes the real server, the simulator predicts every config, the
    search measures the predicted best first; each trial carries its prediction."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [*command(tmp_path, 3, run_dir, validate_top=2, strategy="predict"), "--search", "predict"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["search_strategy"] == "predict", summary.get("search_note")
    assert {"baseline", "profile", "predict", "search", "validation"} <= set(summary["phases"])
    assert summary["stop_reason"] in ("prediction", "trials")
    predictions = json.loads((run_dir / "predictions.json").read_text())
    assert predictions["kind"] == "perfsweep.predictions"
    # The probe's profile is kept; predictions.json's may be refitted from the trials' windows.
    assert json.loads((run_dir / "profile.json").read_text())["source"] == "probe"
    assert predictions["profile"]["source"] in ("probe", "run_dir")
    assert len(predictions["configs"]) >= 40  # every config of the space
    # No prediction exceeds the highest rate offered (traffic.max_rate_rps).
    assert max(c["capacity_rps"] for c in predictions["configs"]) <= 400.0
    first = load_trial_record(run_dir / "trials" / "000" / "measurement.json")
    assert first["source"] == "predict"
    # Its prediction as predictions.json keeps it (a refit re-predicts unmeasured configs only).
    entry = next(c for c in predictions["configs"] if c["config"] == first["config"])
    assert first["prediction"] == {k: entry[k] for k in ("capacity_rps", "low_rps", "high_rps")}
    assert first["prediction"]["low_rps"] < first["prediction"]["capacity_rps"]
    assert summary["best"] is not None and summary["best"]["meets_goals"]
    assert "time per phase" in done.stdout and "search predict" in done.stdout


def test_sigkill_mid_trial_then_resume_loses_no_finished_trial(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Its own session, so one killpg takes the sweep and its managed server down together.
    proc = subprocess.Popen(
        command(tmp_path, 3, run_dir, validate_top=0),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def trial_1_started() -> bool:
        assert proc.poll() is None, "the sweep ended before it could be killed"
        return (run_dir / "trials" / "001" / "config.pbtxt").exists()

    try:
        wait_until(trial_1_started, 240, "trial 1 to start")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finished = load_trial_record(run_dir / "trials" / "000" / "measurement.json")
    killed_config = (run_dir / "trials" / "001" / "config.pbtxt").read_text()
    assert not (run_dir / "trials" / "001" / "measurement.json").exists()
    run_state = json.loads((run_dir / "run.json").read_text())
    assert run_state["status"] == "running"  # killed: nothing got to close the run

    resume = [sys.executable, "-c", "from analyzer.cli import main; main()", "run"]
    done = subprocess.run(
        [*resume, "--resume", str(run_dir)], capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert load_trial_record(run_dir / "trials" / "000" / "measurement.json") == finished
    summary = load_summary(run_dir)
    assert summary["trials"]["complete"] == 3
    # The killed trial is recorded as interrupted everywhere; its config ran again as a new trial.
    assert summary["trials"]["interrupted"] == 1 and summary["trials"]["failed"] == 0
    killed = load_trial_record(run_dir / "trials" / "001" / "measurement.json")
    assert killed["state"] == "interrupted" and killed["failure"].startswith("interrupted")
    rows = {int(r["number"]): r for r in csv.DictReader((run_dir / "trials.csv").open())}
    assert rows[1]["state"] == "interrupted"
    completed = [n for n, r in rows.items() if n >= 0 and r["state"] == "complete"]
    assert len(completed) == 3 and 1 not in completed
    assert any(
        (run_dir / "trials" / f"{n:03d}" / "config.pbtxt").read_text() == killed_config
        for n in completed
    )
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"


def test_kill_9_of_the_sweep_takes_its_managed_server_down(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    log = run_dir / "server" / "server.log"
    proc = subprocess.Popen(
        command(tmp_path, 3, run_dir, validate_top=0),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # cleanup below can take the whole group, whatever happens
    )

    def ready_server_pid() -> int | None:
        text = log.read_text() if log.exists() else ""
        assert proc.poll() is None, "the sweep ended before its server was up"
        return supervised_pid(text) if last_ready(text) is not None else None

    try:
        server_pid = wait_until(ready_server_pid, 240, "the managed server to be ready")
        assert not process_gone(server_pid)
        os.kill(proc.pid, signal.SIGKILL)  # the sweep only: nothing gets to clean up
        proc.wait(timeout=30)
        wait_until(
            lambda: process_gone(server_pid), 15, f"server {server_pid} to end with its sweep"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_sweep_as_locust_master_of_a_remote_worker(tmp_path: Path) -> None:
    """`perfsweep run --expect-workers 1` generates no load itself: a `perfsweep load --worker`
    process (another host in a cluster; here a process on loopback) sends every request."""
    port = free_port()  # for the master (a worker must know it)
    run_dir = tmp_path / "run"
    with remote_load_worker(CLI, port) as worker:
        sweep = command(tmp_path, 1, run_dir, validate_top=0)
        sweep += ["--expect-workers", "1", "--master-port", str(port)]
        done = subprocess.run(sweep, capture_output=True, text=True, timeout=280)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        # The master tells its workers to quit when it stops: a worker that was never part of
        # the sweep would still be waiting for a master.
        _, worker_err = worker.communicate(timeout=30)
        assert worker.returncode == 0, worker_err[-2000:]
    summary = load_summary(run_dir)
    assert summary["trials"]["complete"] == 1
    assert summary["baseline"]["throughput_rps"] > 0
    saved = (run_dir / "scenario.toml").read_text()
    assert "expect_workers = 1" in saved, saved
    record = load_trial_record(run_dir / "trials" / "000" / "measurement.json")
    points = record["measurement"]["points"]
    assert points and all(p["request_count"] > 0 for p in points), worker_err[-2000:]
