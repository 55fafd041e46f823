"""`perfsweep run` end to end on a real reference server (simulated device) and real Locust.

The suite's live sweep of the reference server: what only real processes show (a probe of a
real server, gRPC through a remote Locust worker, the server's own statistics). A small
simulated model (16 floats in, the bundled GPU-like latency profile) keeps requests cheap, so
the generator on a 2-core machine is not the bottleneck. Beside it, without a sweep: a managed
server dies with the process that started it when that process is killed with SIGKILL. What the
sweep decides, resuming a sweep killed mid-trial included, is tested in virtual time
(``test_virtual_sweeps.py``) and on the planted optimum.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.rundir.results import load_summary, load_trial_record, parse_config_text
from reference_server.core.config import validate
from tests.support.servers import (
    NotYet,
    children_of,
    free_port,
    process_gone,
    remote_load_worker,
    wait_until,
    write_model,
)

pytestmark = [pytest.mark.slow]

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
    """The ``perfsweep run`` command line of a sweep of the tiny model."""
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


@pytest.mark.usefixtures("live_sweep")
def test_a_grpc_sweep_through_a_remote_worker_predicts_and_writes_its_report(
    tmp_path: Path,
) -> None:
    """The live sweep of the reference server: ``--search predict`` probes the real server, the
    load goes over gRPC from a ``perfsweep load --worker`` process (another host in a cluster;
    here a process on loopback) that the sweep drives as Locust's master, and the run writes a
    loadable best config and its report. What the sweep decides is pinned in virtual time
    (``test_virtual_sweeps.py``); this is what only a real server and real processes show."""
    port = free_port()  # for the master (a worker must know it)
    run_dir = tmp_path / "run"
    with remote_load_worker(CLI, port) as worker:
        sweep = command(tmp_path, 3, run_dir, validate_top=2, strategy="predict")
        sweep += ["--protocol", "grpc", "--report"]
        sweep += ["--expect-workers", "1", "--master-port", str(port)]
        done = subprocess.run(sweep, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        # The master tells its workers to quit when it stops: a worker that was never part of
        # the sweep would still be waiting for a master.
        _, worker_err = worker.communicate(timeout=30)
        assert worker.returncode == 0, worker_err[-2000:]
    summary = load_summary(run_dir)
    saved = (run_dir / "scenario.toml").read_text()
    assert "expect_workers = 1" in saved, saved
    assert summary["scenario"]["model"]["protocol"] == "grpc"
    # The device is the server's own report (perfsweep_model_device_info), not the flag.
    assert summary["device"] == "sim" and summary["devices"], summary["devices"]
    assert {d["backend"] for d in summary["devices"]} == {"simulated"}
    # The profile phase probed the real server; the predicted best was measured first.
    assert summary["search_strategy"] == "predict", summary.get("search_note")
    assert {"baseline", "profile", "predict", "search", "validation"} <= set(summary["phases"])
    assert json.loads((run_dir / "profile.json").read_text())["source"] == "probe"
    predictions = json.loads((run_dir / "predictions.json").read_text())
    first = load_trial_record(run_dir / "trials" / "000" / "measurement.json")
    assert first["source"] == "predict"
    entry = next(c for c in predictions["configs"] if c["config"] == first["config"])
    assert first["prediction"] == {k: entry[k] for k in ("capacity_rps", "low_rps", "high_rps")}
    assert summary["validation"], "the best config and the baseline were re-measured"
    assert summary["baseline"]["throughput_rps"] > 0
    assert summary["best"]["meets_goals"] and summary["best"]["throughput_rps"] > 0
    best = parse_config_text((run_dir / "best" / "config.pbtxt").read_text())
    validate(best)  # the reference server's Triton-rule validation accepts it
    assert (
        best.name == "tiny" and best.max_batch_size == summary["best"]["config"]["max_batch_size"]
    )
    assert best.parameters["profile"].string_value == "resnet50_sim"
    complete = summary["trials"]["complete"]
    operating = []
    for n in range(complete):
        record = load_trial_record(run_dir / "trials" / f"{n:03d}" / "measurement.json")
        points = record["measurement"]["points"]
        assert points and all(p["request_count"] > 0 for p in points), worker_err[-2000:]
        if record["measurement"]["best"] is not None:
            operating.append(record["measurement"]["best"])
    # At each trial's operating point every request the worker counted reached the server
    # (its statistics agree).
    assert operating, "no trial had an operating point"
    for point in operating:
        assert (
            point["error_count"] == 0 and point["server"]["success_count"] >= point["request_count"]
        )
    assert "ready" in (run_dir / "server" / "server.log").read_text()
    assert (run_dir / "report.html").exists() and summary["files"]["report"] == "report.html"
    # A log (stdout is a pipe here): a plain line per trial as it starts and ends, with the time.
    lines = done.stdout.splitlines()
    for n in range(complete):
        assert any(re.match(rf"\[ *\d+ s\] trial {n} \(.*\): .*measuring$", x) for x in lines)
        assert any(re.match(rf"\[ *\d+ s\] trial {n}: .* req/s, p99 ", x) for x in lines)
    assert any(re.match(r"\[ *\d+ s\] baseline: .* req/s", x) for x in lines), lines[:10]
    assert "time per phase" in done.stdout and "search predict" in done.stdout
    assert_gpu_figures_match_the_server_statistics(run_dir, summary)


def assert_gpu_figures_match_the_server_statistics(run_dir: Path, summary: dict) -> None:
    """The simulated GPU's utilisation (the server's Prometheus gauge, read per window) reaches
    summary.json for the baseline and the best, is the busy share the server's own statistics
    imply at the operating point (compute_infer per execution x executions / time, from
    batch_stats; the simulated backend holds the device for exactly compute_infer), and the
    report's GPU part states the summary's figures; every window is in the time series."""
    from analyzer.report import build_record, load_run
    from analyzer.rundir.records import load_trial

    base, best = summary["baseline"], summary["best"]
    assert base["gpus"] and best and best["gpus"], (base, best)
    (gpu,) = summary["server_gpus"]
    assert gpu["uuid"].startswith("GPU-") and gpu["name"].startswith("simulated GPU")
    folders = {"baseline": run_dir / "baseline"}
    if best["trial_number"] >= 0:
        folders["best"] = run_dir / "trials" / f"{best['trial_number']:03d}"
    for role, folder in folders.items():
        entry = summary[role]
        point = load_trial(folder / "measurement.json").operating_point()
        assert point is not None and point.server is not None
        busy_pct = 100.0 * point.server.execution_compute_infer_us / 1e6 / point.duration_s
        util = entry["gpus"][0]["utilization_pct_mean"]
        # The gauge is the busy share of the trailing second, read once per window: each read
        # of executions arriving at rate r, each d long, varies by sqrt(r) * d (a Poisson count
        # of them in the second), and the mean of k reads by that over sqrt(k): the bound is
        # three of those, and never below 5 points.
        executions = max(point.server.execution_count, 1)
        rate = executions / point.duration_s
        length_s = point.server.execution_compute_infer_us / 1e6 / executions
        reads = max(len(point.windows), 1)
        sigma_pct = 100.0 * math.sqrt(rate) * length_s / math.sqrt(reads)
        assert abs(util - busy_pct) < max(5.0, 3 * sigma_pct), (role, util, busy_pct, sigma_pct)
    record = build_record(load_run(run_dir), min_gpu_utilization_pct=100.0)
    assert record.gpu is not None and "gpu" not in record.missing
    sides = {s.role: s for s in record.gpu.sides}
    assert set(sides) == {"baseline", "best"}
    for role, side in sides.items():
        (figures,) = summary[role]["gpus"]
        assert side.utilization_pct_mean == pytest.approx(figures["utilization_pct_mean"])
        assert side.memory_used_peak_mb == figures["memory_used_peak_mb"]
    assert record.gpu.sentences
    assert record.time_series
    for series in record.time_series:
        assert series.points and all(p.throughput_rps >= 0 for p in series.points)


#: A process that holds a started managed reference server until it is killed (what ``perfsweep
#: run`` does with its server, without a sweep): the server's pid on stdout once it is ready.
HOLDER = """
import sys, time
from pathlib import Path
from analyzer.target.managed import ManagedServer
server = ManagedServer("tiny", "sim", Path(sys.argv[2]), repository=Path(sys.argv[1]))
server.start()
print(server.pid(), flush=True)
time.sleep(600)
"""


@pytest.mark.usefixtures("spawns")
def test_kill_9_of_its_owner_takes_a_managed_reference_server_down(tmp_path: Path) -> None:
    """``kill -9`` of the process that started a managed reference server (a sweep killed
    mid-trial): the server ends with it, though nothing got to stop it."""
    out = tmp_path / "holder.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(make_repo(tmp_path)), str(tmp_path / "server.log")],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one killpg below ends the holder and its server
        )

    def server_pid() -> int:
        assert proc.poll() is None, f"the holder ended: {out.read_text()[-2000:]}"
        line = out.read_text().strip()
        if not line.isdigit():
            raise NotYet("the holder has not printed the server's pid")
        return int(line)

    try:
        pid = wait_until(server_pid, 180, "the managed server to be ready")
        # The holder's own child, the reference server, runs until the holder is killed.
        assert "reference_server" in children_of(proc.pid).get(pid, ""), children_of(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # the owner only: nothing gets to clean up
        proc.wait(timeout=30)
        wait_until(lambda: process_gone(pid), 15, f"server {pid} to end with its owner")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
