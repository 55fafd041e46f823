"""gRPC, several generator processes and a data file in ``perfsweep gate`` (and the options).

The gate measures the managed reference server over gRPC with two local Locust workers; the
managed server's ports are free ones, so the gRPC address must come from the server itself,
not from the HTTP port + 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.config.scenario import Scenario, load_scenario
from analyzer.config.sections import data_digest
from analyzer.gate.plan import GateFlags, measurement_hash, plan_measurement, resolve_criteria
from analyzer.load.engine import engine_options
from tests.load.refserver import REPO_ROOT, write_sim_model
from tests.support.servers import free_port, remote_load_worker


def test_grpc_options_load_the_grpc_port_and_read_statistics_over_http() -> None:
    s = load_scenario(None, {"model.protocol": "grpc"}, env={})
    managed = engine_options(s, "http://127.0.0.1:40000", "m", grpc_url="127.0.0.1:40123")
    assert (managed.protocol, managed.url, managed.stats_url) == (
        "grpc",
        "127.0.0.1:40123",
        "127.0.0.1:40000",
    )
    # A --url server without a known gRPC address: Triton's layout, HTTP port + 1.
    remote = engine_options(s, "http://triton:8000", "m")
    assert (remote.url, remote.stats_url) == ("triton:8001", "triton:8000")
    http = engine_options(load_scenario(None, env={}), "http://h:8000", "m", grpc_url="h:9")
    assert (http.protocol, http.url, http.stats_url) == ("http", "h:8000", None)


def test_the_gate_fingerprint_counts_protocol_and_data_bytes_not_paths(tmp_path: Path) -> None:
    def fingerprint(s: Scenario) -> str:
        criteria = resolve_criteria(GateFlags(p99_ms=9), None)
        plan = plan_measurement(s, criteria, 1, 30.0, None, None, None, None, 2)
        return measurement_hash(s, plan, "sim")

    def with_data(name: str, text: str, **more: object) -> Scenario:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return load_scenario(None, {"input.data_file": str(path), **more}, env={})

    one = with_data("a/data.json", '{"data": [{"X": [1]}]}')
    assert fingerprint(one) == fingerprint(with_data("b/data.json", '{"data": [{"X": [1]}]}'))
    assert fingerprint(one) != fingerprint(with_data("c/data.json", '{"data": [{"X": [2]}]}'))
    grpc = with_data("a/data.json", '{"data": [{"X": [1]}]}', **{"model.protocol": "grpc"})
    assert fingerprint(one) != fingerprint(grpc)


@pytest.mark.slow
@pytest.mark.usefixtures("spawns")
def test_gate_measures_over_grpc_with_two_generator_processes(tmp_path: Path) -> None:
    write_sim_model(tmp_path / "repo", "m", device_ms=2.0)
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"INPUT0": [float(i)] * 16} for i in range(3)]}))
    out = tmp_path / "candidate.json"
    done = subprocess.run(
        [
            sys.executable, "-c", "from analyzer.cli import main; main()", "gate",
            "--model", "m", "--model-repository", str(tmp_path / "repo"), "--device", "sim",
            "--protocol", "grpc", "--workers", "2", "--input-data", str(data),
            "--p99-ms", "200", "--rate-rps", "20",
            "--warmup-s", "0.5", "--window-s", "1", "--windows", "2", "--repeats", "1",
            "--output", str(out),
        ],
        capture_output=True, text=True, timeout=240, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["environment"]["protocol"] == "grpc"
    assert doc["environment"]["generator_processes"] == 2
    assert doc["environment"]["input"]["data_sha256"] == data_digest(data)
    (m,) = doc["results"]
    assert m["error_count"] == 0 and m["request_count"] >= 20


def _gate(tmp_path: Path, *flags: str) -> list[str]:
    write_sim_model(tmp_path / "repo", "m", device_ms=2.0)
    return [
        sys.executable, "-c", "from analyzer.cli import main; main()", "gate",
        "--model", "m", "--model-repository", str(tmp_path / "repo"), "--device", "sim",
        "--p99-ms", "200", "--rate-rps", "20",
        "--warmup-s", "0.5", "--window-s", "1", "--windows", "2", "--repeats", "1", *flags,
    ]  # fmt: skip


@pytest.mark.usefixtures("spawns")
def test_gate_as_locust_master_of_a_remote_worker(tmp_path: Path) -> None:
    """``gate --expect-workers 1``: a ``perfsweep load --worker`` process (another host in a
    cluster; here one on loopback) sends every request of the measurement."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cli = [sys.executable, "-c", "from analyzer.cli import main; main()"]
    out = tmp_path / "candidate.json"
    port = free_port()  # for the master (the worker must know it)
    with remote_load_worker(cli, port, cwd=REPO_ROOT, env=env) as worker:
        gate = _gate(tmp_path, "--expect-workers", "1", "--master-port", str(port))
        done = subprocess.run(
            [*gate, "--output", str(out)],
            capture_output=True, text=True, timeout=240, cwd=REPO_ROOT, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        # The master tells its worker to quit when it stops.
        _, worker_err = worker.communicate(timeout=30)
        assert worker.returncode == 0, worker_err[-2000:]
    (m,) = json.loads(out.read_text())["results"]
    assert m["workers"] == 1 and m["error_count"] == 0 and m["request_count"] >= 20


@pytest.mark.usefixtures("spawns")
def test_gate_refuses_remote_workers_with_a_live_baseline(tmp_path: Path) -> None:
    done = subprocess.run(
        [*_gate(tmp_path, "--expect-workers", "1"), "--baseline-url", "http://127.0.0.1:1"],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "remote workers follow one Locust master" in done.stdout + done.stderr
