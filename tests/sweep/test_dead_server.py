"""A server that dies mid-sweep, on real processes: it is a server failure, never a measurement.

Each test starts a real server (the reference server as ``perfsweep serve``, or Triton 2.51 from
the nvidia-pytriton wheel), runs ``perfsweep run --url`` against it as a user would, and kills
(``kill -9``) or stops (``SIGSTOP``) the server in the middle of a trial:

* not back within ``--server-wait``: exit status 3 soon after the death, run.json ``failed``
  with the trial, the trial ``interrupted: server died``, no validation, no best config, no
  significant gain; ``--resume`` once the server is back finishes the run with the earlier
  trials kept;
* back within the wait (a restarted pod, same address: a real Triton started again): the trial
  runs again, exit 0, the outage recorded in summary.json and run.json.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analyzer.rundir.results import load_summary
from analyzer.search.study import DIED_REASON
from tests.support.real_triton import RealTriton, TritonInstall, sleep_model_config
from tests.support.servers import ChildProcess, free_port, wait_until
from tests.support.sweeps import CLI, small_scenario

pytestmark = pytest.mark.slow


class ServedOnFixedPorts:
    """``perfsweep serve --model resnet50 --device sim`` on ports chosen once, so that a server
    started again after a kill comes back at the same address, as a restarted pod does."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = [free_port(), free_port(), free_port()]
        while len(set(self.ports)) < 3:
            self.ports = [free_port(), free_port(), free_port()]
        self.child: ChildProcess | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    def start(self) -> None:
        http, grpc, metrics = self.ports
        self.starts += 1
        self.child = ChildProcess(
            [
                *CLI,
                "serve",
                "--model",
                "resnet50",
                "--device",
                "sim",
                "--http-port",
                str(http),
                "--grpc-port",
                str(grpc),
                "--metrics-port",
                str(metrics),
            ],
            self.workdir / f"serve-{self.starts}.log",
        )
        self.child.wait_ready(120)

    def signal(self, sig: int) -> None:
        assert self.child is not None
        os.killpg(self.child.pid, sig)

    def kill(self) -> None:
        """``kill -9``, and wait until it is gone."""
        assert self.child is not None
        self.signal(signal.SIGKILL)
        self.child.proc.wait(10)
        self.child = None

    def stop(self) -> None:
        if self.child is not None:
            self.signal(signal.SIGCONT)  # a stopped server must be able to take its SIGTERM
            self.child.stop(10)
            self.child = None


@pytest.fixture()
def served(tmp_path: Path, spawns: None) -> Iterator[ServedOnFixedPorts]:
    server = ServedOnFixedPorts(tmp_path / "server")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def sweep(
    tmp_path: Path, url: str, model: str, run_dir: Path, *extra: str
) -> subprocess.Popen[str]:
    scenario = tmp_path / "s.toml"
    scenario.write_text(small_scenario(model=model))
    command = [
        *CLI,
        "run",
        "--scenario",
        str(scenario),
        "--url",
        url,
        "--run-dir",
        str(run_dir),
        *extra,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def resume(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "run", "--resume", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=280,
    )


def when_trial_runs(
    proc: subprocess.Popen[str], run_dir: Path, number: int, settle_s: float
) -> None:
    """Wait until trial ``number``'s config was written, then ``settle_s`` more: its config is
    loaded and its load is running."""

    def started() -> bool:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        return (run_dir / "trials" / f"{number:03d}" / "config.pbtxt").exists()

    wait_until(started, 240, f"trial {number} to start", poll_s=0.05)
    time.sleep(settle_s)


def finish(proc: subprocess.Popen[str], timeout_s: float) -> str:
    try:
        return proc.communicate(timeout=timeout_s)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def trial_rows(run_dir: Path) -> dict[int, dict[str, str]]:
    with (run_dir / "trials.csv").open(newline="") as f:
        return {int(row["number"]): row for row in csv.DictReader(f)}


def run_state(run_dir: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((run_dir / "run.json").read_text())
    return state


def assert_stopped_on_a_dead_server(run_dir: Path, output: str, number: int) -> None:
    """Exit 3's files: the trial interrupted, nothing measured against the dead server, the
    best not validated, run.json failed with the trial, the resume command printed."""
    rows = trial_rows(run_dir)
    assert rows[number]["state"] == "interrupted" and rows[number]["failure"] == DIED_REASON
    for row in rows.values():  # no complete trial is a measurement of the dead server
        if row["state"] == "complete":
            assert float(row["throughput_rps"]) > 0 and float(row["error_rate"]) <= 0.01, row
    assert not (run_dir / "validation.json").exists()
    assert not (run_dir / "best" / "config.pbtxt").exists()
    summary = load_summary(run_dir)
    assert summary["stop_reason"] == "server_died"
    assert summary["gain_significant"] is None and summary["gain_ci"] is None
    assert summary["files"]["best_config"] is None
    if summary["gain"] is not None:
        assert "NOT VALIDATED" in summary["gain_text"]
    assert [e["event"] for e in summary["server_events"]] == ["died", "lost"], output[-3000:]
    state = run_state(run_dir)
    assert state["status"] == "failed" and state["failed_trial"]["number"] == number
    assert "did not return within" in state["error"] and state["failed_at"]
    assert f"server: trial {number}: died:" in output
    assert f"resume with: perfsweep run --resume {run_dir}" in output
    assert "significant" not in output.replace("no significant", "")


def assert_resumed(run_dir: Path, before: dict[int, dict[str, str]], done: Any) -> None:
    """A --resume after the server is back: the run completes, the earlier trials kept as they
    were measured, the death still on record."""
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    rows = trial_rows(run_dir)
    for number, row in before.items():
        if row["state"] == "complete":
            assert rows[number] == row  # kept, not measured again
    state = run_state(run_dir)
    assert state["status"] == "completed" and "error" not in state
    assert "did not return within" in state["earlier_failures"][0]["error"]
    summary = load_summary(run_dir)
    assert summary["stop_reason"] != "server_died"
    assert [e["event"] for e in summary["server_events"]][:2] == ["died", "lost"]
    assert sum(r["state"] == "complete" and int(n) >= 0 for n, r in rows.items()) == 2


def test_a_url_server_killed_mid_trial_stops_the_run_and_resume_finishes_it(
    served: ServedOnFixedPorts, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    proc = sweep(tmp_path, served.url, "resnet50", run_dir, "--server-wait", "3")
    when_trial_runs(proc, run_dir, 1, settle_s=1.5)
    served.kill()
    killed = time.monotonic()
    output = finish(proc, 120)
    took = time.monotonic() - killed
    assert proc.returncode == 3, output[-3000:]
    assert took < 30, f"{took:.1f} s from the kill to the exit"
    assert "died or hangs: it stopped answering during a load step" in output
    assert_stopped_on_a_dead_server(run_dir, output, 1)
    before = trial_rows(run_dir)

    served.start()
    assert_resumed(run_dir, before, resume(run_dir))


def test_a_hung_server_is_a_dead_one(served: ServedOnFixedPorts, tmp_path: Path) -> None:
    # SIGSTOP: connections are accepted by the kernel and never answered. Requests do not
    # fail, they hang: the step ends at its bound, the health check times out, the run stops.
    run_dir = tmp_path / "run"
    proc = sweep(tmp_path, served.url, "resnet50", run_dir, "--server-wait", "2")
    when_trial_runs(proc, run_dir, 1, settle_s=1.5)
    served.signal(signal.SIGSTOP)
    output = finish(proc, 180)
    assert proc.returncode == 3, output[-3000:]
    assert "died or hangs" in output
    assert_stopped_on_a_dead_server(run_dir, output, 1)


TRITON_MODEL = "sweep_sleep"


@pytest.fixture()
def triton(triton_install: TritonInstall, tmp_path: Path) -> Iterator[RealTriton]:
    """Triton 2.51 with a Python-backend model loaded at startup (so a restart loads it too)."""
    config = sleep_model_config(
        TRITON_MODEL, max_batch_size=8, execute_delay_ms=4.0, execute_delay_ms_per_item=0.5
    )
    server = RealTriton(triton_install, tmp_path / "triton", models=[config])
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.triton
def test_a_real_triton_killed_mid_trial_stops_the_run_and_resume_finishes_it(
    triton: RealTriton, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    url = f"http://{triton.http_url}"
    proc = sweep(tmp_path, url, TRITON_MODEL, run_dir, "--server-wait", "3")
    when_trial_runs(proc, run_dir, 1, settle_s=4.0)
    triton.stop()  # SIGKILL of the server and its stubs, as a crash leaves them
    killed = time.monotonic()
    output = finish(proc, 120)
    took = time.monotonic() - killed
    assert proc.returncode == 3, output[-3000:]
    assert took < 30, f"{took:.1f} s from the kill to the exit"
    assert_stopped_on_a_dead_server(run_dir, output, 1)
    before = trial_rows(run_dir)

    triton.revive()
    assert_resumed(run_dir, before, resume(run_dir))


@pytest.mark.triton
def test_a_real_triton_back_within_the_wait_completes_the_run(
    triton: RealTriton, tmp_path: Path
) -> None:
    # A restarted pod: the same address, the model loaded from disk with its own config.
    run_dir = tmp_path / "run"
    url = f"http://{triton.http_url}"
    proc = sweep(tmp_path, url, TRITON_MODEL, run_dir, "--server-wait", "60")
    when_trial_runs(proc, run_dir, 1, settle_s=4.0)
    triton.revive()  # killed, then started again on its ports (ready in ~10 s)
    output = finish(proc, 240)
    assert proc.returncode == 0, output[-3000:]
    summary = load_summary(run_dir)
    assert [o["returned"] for o in summary["outages"]] == [True], output[-3000:]
    assert 0 < summary["outages"][0]["waited_s"] < 60
    assert [(e["trial"], e["event"]) for e in summary["server_events"]] == [(1, "died")]
    assert run_state(run_dir)["outages"] == summary["outages"]
    assert "answers again after" in output
    rows = trial_rows(run_dir)
    # The trial that lost its server was measured again on the returned one.
    assert [rows[n]["state"] for n in (0, 1)] == ["complete", "complete"], rows
    assert all(float(rows[n]["throughput_rps"]) > 0 for n in (0, 1))
    assert (run_dir / "validation.json").exists() and summary["files"]["best_config"]


def test_load_stops_with_exit_3_when_its_server_dies(
    served: ServedOnFixedPorts, tmp_path: Path
) -> None:
    # perfsweep load follows the same rule: the level the server died in is not a result.
    command = [*CLI, "load", "--url", served.url, "--model", "resnet50"]
    command += ["--request-rate", "20,20,20,20,20,20", "--window-s", "1", "--max-windows", "3"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    # Killed once a level is under way (the server has counted inferences): killed before the
    # generator's first request, the server is unreachable at the start, a different error.
    def inferring() -> bool:
        assert proc.poll() is None, finish(proc, 10)[-3000:]
        with urllib.request.urlopen(f"{served.url}/v2/models/resnet50/stats", timeout=2) as r:
            (stats,) = json.load(r)["model_stats"]
        return int(stats["inference_count"]) > 0

    wait_until(inferring, 120, "perfsweep load's first level reaches the server")
    time.sleep(1.0)  # into the level, past its first requests
    served.kill()
    killed = time.monotonic()
    output = finish(proc, 60)
    assert proc.returncode == 3, output[-3000:]
    assert time.monotonic() - killed < 30
    assert "died or hangs: it stopped answering during a load step" in output
