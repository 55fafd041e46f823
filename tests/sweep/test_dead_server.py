"""A server that dies mid-sweep: it is a server failure, never a measurement.

Live, on real processes: a reference server (``perfsweep serve``) at a fixed address is killed
(``kill -9``) in the middle of a ``perfsweep run --url`` trial, or a ``perfsweep load`` level,
and stopped (``SIGSTOP``) under the targets' liveness check:

* not back within ``--server-wait``: exit status 3 soon after the death, run.json ``failed``
  with the trial, the trial ``interrupted: server died``, no validation, no best config, no
  significant gain; ``--resume`` once the server is back finishes the run with the earlier
  trials kept;
* a hung server (``SIGSTOP``: connections accepted, never answered) fails its health check: it
  is a dead one.

In virtual time (:mod:`analyzer.predict.virtual`, through ``run_sweep``): a server that stops
answering in the middle of trial 1 (its load raises :class:`~analyzer.errors.TargetDiedError`
as the Locust engine does) and is waited for as a ``--url`` server is:

* back within the wait (a restarted pod, same address): the trial runs again, the run
  completes, the outage recorded in summary.json and run.json;
* not back: the run stops as above, and a resumed run with the server back finishes it.
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from analyzer.config.scenario import Scenario, load_scenario
from analyzer.errors import TargetDiedError
from analyzer.measure.measurement import Measurement
from analyzer.measure.specs import LoadMode, LoadSpec
from analyzer.predict.virtual import VirtualLoad, VirtualServer, virtual_seams
from analyzer.rundir.results import load_summary, utc_now
from analyzer.rundir.summary import StopReason
from analyzer.search.study import DIED_REASON
from analyzer.sweep.loop import run_sweep
from analyzer.sweep.state import SweepObserver, SweepOutcome
from analyzer.target.liveness import check_step, live, wait_for_return
from analyzer.target.remote import RemoteTarget
from analyzer.target.transport import MockTransport, Request, Response, Transport, UrllibTransport
from tests.support.servers import ChildProcess, free_port, wait_until
from tests.support.sweeps import CLI, small_scenario

pytestmark = [pytest.mark.usefixtures("takes_seconds")]


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


def assert_stopped_on_a_dead_server(run_dir: Path, output: str | None, number: int) -> None:
    """Exit 3's files: the trial interrupted, nothing measured against the dead server, the
    best not validated, run.json failed with the trial; and, given the command's ``output``,
    the death and the resume command printed."""
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
    assert [e["event"] for e in summary["server_events"]] == ["died", "lost"], (output or "")[
        -3000:
    ]
    state = run_state(run_dir)
    assert state["status"] == "failed" and state["failed_trial"]["number"] == number
    assert "did not return within" in state["error"] and state["failed_at"]
    if output is None:
        return
    assert f"server: trial {number}: died:" in output
    assert f"resume with: perfsweep run --resume {run_dir}" in output
    assert "significant" not in output.replace("no significant", "")


def assert_resumed(run_dir: Path, before: dict[int, dict[str, str]], done: Any = None) -> None:
    """A --resume after the server is back: the run completes, the earlier trials kept as they
    were measured, the death still on record (``done``: the command's result, exit 0 or 1)."""
    if done is not None:
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


@pytest.mark.usefixtures("live_sweep")
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


class ShortTimeouts:
    """The real HTTP transport with every request's timeout cut to ``timeout_s``: a stopped
    process never answers, however long it is waited for."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.inner = UrllibTransport()

    def request(self, request: Request) -> Response:
        return self.inner.request(
            replace(request, timeout_s=min(request.timeout_s, self.timeout_s))
        )


def test_a_hung_server_is_a_dead_one(served: ServedOnFixedPorts) -> None:
    # SIGSTOP: connections are accepted by the kernel and never answered. Requests do not
    # fail, they hang: the load step ends at its bound with nothing completed, the health
    # check times out, and the server is not waited back.
    transport: Transport = ShortTimeouts(1.0)
    target = RemoteTarget(served.url, "resnet50", transport=transport, wait_s=1.0)
    target.start()
    target.ensure_alive()  # answering: nothing to wait for, nothing recorded
    assert target.outages == []
    served.signal(signal.SIGSTOP)
    hung = Measurement(
        mode=LoadMode.REQUEST_RATE,
        target=20.0,
        throughput_rps=0.0,
        p50_ms=0.0,
        p90_ms=0.0,
        p95_ms=0.0,
        p99_ms=0.0,
        request_count=0,
        error_count=0,
        stable=False,
        valid=False,
        send_lag_p99_ms=0.0,
        server=None,
    )
    with pytest.raises(TargetDiedError, match=r"died or hangs: .*no request completed"):
        check_step(hung, served.url, transport)
    with pytest.raises(TargetDiedError, match="did not return within 1 s"):
        target.ensure_alive()
    assert [(o["returned"], o["waited_s"]) for o in target.outages] == [(False, 1.0)]


SERVER_WAIT_S = 60.0


def virtual_scenario(tmp_path: Path, server_wait_s: float) -> Scenario:
    """The small sweep of the bundled model on the simulated device, in virtual time."""
    path = tmp_path / "s.toml"
    path.write_text(small_scenario(model="resnet50"))
    overrides = {
        "model.server": "virtual",
        "model.device": "sim",
        "run.server_wait_s": server_wait_s,
    }
    return load_scenario(path, overrides, env={})


@dataclass
class FlakyServer(VirtualServer):
    """A virtual server that stops answering once, after the first level of trial
    :attr:`dies_in`, and is waited for as :class:`~analyzer.target.remote.RemoteTarget` waits
    for a ``--url`` server: its health polled every second of the sweep's clock for up to
    :attr:`wait_s`, each outage recorded (``describe()["outages"]``).

    Attributes:
        dies_in: The trial whose load loses the server.
        back_after_s: Seconds after the death the server answers again (None: never).
        wait_s: How long :meth:`ensure_alive` waits (``run.server_wait_s``).
        trial: The trial under way (set by :class:`Console`).
        levels_in_trial: Levels measured in trial :attr:`dies_in` so far.
        died_at: When it stopped answering, on the sweep's clock (None: it has not).
        outages: Each wait for it: when, how long, and whether it returned.
    """

    dies_in: int = 1
    back_after_s: float | None = None
    wait_s: float = SERVER_WAIT_S
    trial: int | None = None
    levels_in_trial: int = 0
    died_at: float | None = None
    outages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def health(self) -> MockTransport:
        """The server's health endpoint as a transport reaches it."""
        return MockTransport(self._health)

    def answering(self) -> bool:
        if self.died_at is None:
            return True
        return self.back_after_s is not None and self.clock() >= self.died_at + self.back_after_s

    def _health(self, request: Request) -> Response:
        if not self.answering():
            raise ConnectionRefusedError(111, "Connection refused")
        return Response(200)

    def ensure_alive(self) -> None:
        if live(self.url, self.health):
            return
        started_at = utc_now()
        waited = wait_for_return(
            self.url,
            self.wait_s,
            self.notify,
            transport=self.health,
            clock=self.clock,
            sleep=self.clock.advance,
        )
        outage: dict[str, Any] = {"started_at": started_at, "returned": waited is not None}
        outage["waited_s"] = round(self.wait_s if waited is None else waited, 1)
        self.outages.append(outage)
        if waited is None:
            raise TargetDiedError(
                f"the server at {self.url} stopped answering and did not return within "
                f"{self.wait_s:g} s (run.server_wait_s, --server-wait-s)",
                self.url,
            )

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "outages": list(self.outages)}


@dataclass
class FlakyLoad(VirtualLoad):
    """The virtual load on a :class:`FlakyServer`: a level the server does not answer has every
    request refused, and the liveness rule the Locust engine applies after each step raises."""

    server: FlakyServer

    def measure(self, spec: LoadSpec) -> Measurement:
        server = self.server
        m = super().measure(spec)
        if server.trial == server.dies_in and server.died_at is None:
            server.levels_in_trial += 1
            if server.levels_in_trial > 1:
                server.died_at = server.clock()
        if not server.answering():
            refused = {"ConnectionRefusedError: [Errno 111] Connection refused": m.request_count}
            failed = replace(m, error_count=m.request_count, errors=refused, server=None)
            check_step(failed, server.url, server.health)
        return m


class Console(SweepObserver):
    """What the console shows of the server, and the trial under way (told to the server)."""

    def __init__(self, server: FlakyServer) -> None:
        self.server = server
        self.lines: list[str] = []

    def on_trial_start(self, number: int, source: str, knobs: Any, index: int, budget: int) -> None:
        self.server.trial = number

    def on_server(self, text: str) -> None:
        self.lines.append(f"server: {text}")

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def flaky_server(scenario: Scenario, back_after_s: float | None) -> FlakyServer:
    """The scenario's virtual server, dying in trial 1's load and back ``back_after_s`` later,
    waited for ``run.server_wait_s``."""
    base = VirtualServer.of(scenario)
    return FlakyServer(
        base.model,
        base.configs,
        base.profiles,
        base.stages,
        back_after_s=back_after_s,
        wait_s=scenario.run.server_wait_s,
    )


def flaky_sweep(scenario: Scenario, run_dir: Path, console: Console) -> SweepOutcome:
    """``run_sweep`` in virtual time on ``console``'s server (TargetDiedError, its ``outcome``
    set, when the run stops)."""
    server = console.server
    return run_sweep(
        scenario,
        target=server,
        load=FlakyLoad(server, scenario),
        clock=server.clock,
        profiler=server.profile,
        run_dir=run_dir,
        observer=console,
    )


def test_a_server_back_within_the_wait_completes_the_run(tmp_path: Path) -> None:
    # A restarted pod: the same address, back 10 s after it stopped answering.
    run_dir = tmp_path / "run"
    scenario = virtual_scenario(tmp_path, SERVER_WAIT_S)
    server = flaky_server(scenario, back_after_s=10.0)
    console = Console(server)
    outcome = flaky_sweep(scenario, run_dir, console)
    assert server.died_at is not None, "the server never stopped answering"
    assert outcome.stop_reason is not StopReason.SERVER_DIED and outcome.best is not None
    summary = load_summary(run_dir)
    assert [o["returned"] for o in summary["outages"]] == [True], console.output
    assert 0 < summary["outages"][0]["waited_s"] < SERVER_WAIT_S
    assert [(e["trial"], e["event"]) for e in summary["server_events"]] == [(1, "died")]
    assert run_state(run_dir)["outages"] == summary["outages"]
    assert run_state(run_dir)["status"] == "completed"
    assert "answers again after" in console.output
    rows = trial_rows(run_dir)
    # The trial that lost its server was measured again on the returned one.
    assert [rows[n]["state"] for n in (0, 1)] == ["complete", "complete"], rows
    assert all(float(rows[n]["throughput_rps"]) > 0 for n in (0, 1))
    assert (run_dir / "validation.json").exists() and summary["files"]["best_config"]


def test_a_server_not_back_within_the_wait_stops_the_run_and_resume_finishes_it(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    scenario = virtual_scenario(tmp_path, 3.0)
    console = Console(flaky_server(scenario, back_after_s=None))
    with pytest.raises(TargetDiedError, match="did not return within 3 s") as stopped:
        flaky_sweep(scenario, run_dir, console)
    outcome = stopped.value.outcome
    assert isinstance(outcome, SweepOutcome)
    assert outcome.stop_reason is StopReason.SERVER_DIED and outcome.best_config_path is None
    assert_stopped_on_a_dead_server(run_dir, None, 1)
    assert "server: trial 1: died:" in console.output
    summary = load_summary(run_dir)
    assert [(o["returned"], o["waited_s"]) for o in summary["outages"]] == [(False, 3.0)]
    events = [(e["trial"], e["event"]) for e in summary["server_events"]]
    assert events == [(1, "died"), (1, "lost")]
    before = trial_rows(run_dir)

    # The server is back: a healthy one, as --resume finds it.
    server, load, clock, profiler = virtual_seams(scenario)
    run_sweep(
        scenario,
        target=server,
        load=load,
        clock=clock,
        profiler=profiler,
        run_dir=run_dir,
        resume=True,
    )
    assert_resumed(run_dir, before)
    # The trial the server died in stays on record as interrupted.
    assert trial_rows(run_dir)[1]["failure"] == DIED_REASON


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
