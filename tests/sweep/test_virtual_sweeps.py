"""``perfsweep run`` in virtual time: the whole command against the simulated device, in seconds.

Every test here runs ``perfsweep run --server virtual`` in the test process
(:func:`tests.support.sweeps.virtual_sweep`): the flags, the scenario, the run directory and its
records, resume, the console and the exit status are the command's own; the server and the load
generator are :mod:`analyzer.predict.virtual`'s, and the clock is virtual, so time budgets and
phase times count the simulated levels' length; only the sweep killed with SIGKILL runs in a
child process (a signal nothing can catch needs a process of its own), and its resume runs here.
What only a real server shows (a managed server's pid, its end with its owner, what reaches the
wire) is pinned by ``test_e2e_sim.py``, ``test_dead_server.py`` and the Triton tests.
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
import time
from pathlib import Path
from typing import Any

import pytest

from analyzer.rundir.results import load_summary, load_trial_record, parse_config_text
from reference_server.core.config import validate
from tests.support.servers import wait_until, write_sim_model
from tests.support.sweeps import virtual_sweep

pytestmark = [pytest.mark.usefixtures("takes_seconds")]

SCENARIO = """
objective = "throughput"
[model]
name = "tiny"
device = "sim"
[traffic]
min_rate_rps = 5.0
start_rps = 40.0
max_rate_rps = 2000.0
[goals]
p99_ms = {p99_ms}
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
capacity_resolution = 0.2
validate_top = 1
validate_repeats = 1
[search]
strategy = "{strategy}"
"""


def tiny(tmp_path: Path, trials: int = 4, strategy: str = "tpe", p99_ms: float = 60.0) -> list[str]:
    """A simulated model (4 ms + 0.5 ms an item on the device, 0.5 ms host each side) and
    the flags of a sweep of it."""
    write_sim_model(tmp_path / "repo", "tiny", 4.0, per_item_ms=0.5, host_ms=0.5, max_batch_size=16)
    scenario = tmp_path / f"tiny-{trials}-{strategy}.toml"
    scenario.write_text(SCENARIO.format(trials=trials, strategy=strategy, p99_ms=p99_ms))
    return ["--scenario", str(scenario), "--model-repository", str(tmp_path / "repo")]


def test_twenty_trials_of_the_bundled_model_write_a_loadable_best_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *("--model", "resnet50", "--device", "sim", "--search", "tpe", "--trials", "20"),
        *("--patience", "100", "--time-budget", "100000", "--run-dir", str(run_dir)),
    )
    # Reported, never asserted: how long 20 trials take in virtual time on this machine.
    print(f"20 trials in virtual time: {time.monotonic() - t0:.1f} s of wall time")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["trials"]["complete"] == 20 and summary["stop_reason"] == "trials"
    target = summary["environment"]["target"]
    assert target["kind"] == "virtual" and "resnet50_sim" in target["profiles"]["resnet50"]
    # The clock is the levels' own: 20 capacity searches of seconds each, not the wall time.
    assert summary["phases"]["search"] > 60 and summary["duration_s"] > 60
    assert summary["best"]["meets_goals"]
    assert summary["best"]["throughput_rps"] > 2 * summary["baseline"]["throughput_rps"]
    best = parse_config_text((run_dir / "best" / "config.pbtxt").read_text())
    validate(best)  # the reference server's Triton-rule validation accepts it
    assert best.name == "resnet50" and best.parameters["profile"].string_value == "resnet50_sim"
    assert best.max_batch_size == summary["best"]["config"]["max_batch_size"]
    for n in range(20):
        record = load_trial_record(run_dir / "trials" / f"{n:03d}" / "measurement.json")
        assert record["duration_s"] > 0 and record["measurement"]["points"]
        point = record["measurement"]["best"]
        if point is not None:  # the server's statistics of the operating point: its batches
            assert point["server"]["execution_count"] > 0
            assert point["server"]["avg_batch_size"] >= 1.0
    lines = done.stdout.splitlines()
    for n in range(20):
        assert any(re.match(rf"\[ *\d+ s\] trial {n}: .* req/s, p99 ", x) for x in lines), n
    assert "best config:" in done.stdout and "gain over baseline" in done.stdout
    assert "(virtual time)" in done.stdout


def test_a_time_budget_counts_virtual_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *tiny(tmp_path, trials=50),
        *("--time-budget", "30", "--run-dir", str(run_dir)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["stop_reason"] == "time_budget"
    assert 1 <= summary["trials"]["complete"] < 50
    assert "stopped by: time_budget" in done.stdout


def test_patience_stops_a_search_that_no_longer_improves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *tiny(tmp_path, trials=40),
        *("--patience", "3", "--run-dir", str(run_dir)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["stop_reason"] == "stagnation"
    assert summary["trials"]["complete"] < 40


@pytest.mark.usefixtures("spawns")  # the predict phase simulates the space in worker processes
def test_predict_measures_the_predicted_best_first_and_stops_in_its_band(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch,
        capsys,
        *tiny(tmp_path, trials=6, strategy="predict"),
        "--run-dir",
        str(run_dir),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = load_summary(run_dir)
    assert summary["search_strategy"] == "predict", summary.get("search_note")
    assert {"baseline", "profile", "predict", "search", "validation"} <= set(summary["phases"])
    # The profile is the simulated device's own: the prediction is right, the first
    # measurement lands in its band and the search stops there.
    assert summary["stop_reason"] == "prediction" and summary["trials"]["complete"] == 1
    predictions = json.loads((run_dir / "predictions.json").read_text())
    assert predictions["kind"] == "perfsweep.predictions"
    assert len(predictions["configs"]) >= 40  # every config of the space
    assert max(c["capacity_rps"] for c in predictions["configs"]) <= 2000.0
    first = load_trial_record(run_dir / "trials" / "000" / "measurement.json")
    assert first["source"] == "predict"
    best = max(predictions["configs"], key=lambda c: c["capacity_rps"])
    assert first["config"] == best["config"]
    # In its band (a measured throughput is the requests over the level's span: to rounding).
    low, high = first["prediction"]["low_rps"], first["prediction"]["high_rps"]
    assert low * 0.999 <= first["throughput_rps"] <= high * 1.001
    assert "search predict" in done.stdout and "time per phase" in done.stdout


def test_a_resumed_run_keeps_its_trials_and_completes_the_new_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    first = virtual_sweep(monkeypatch, capsys, *tiny(tmp_path, trials=3), "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    kept = {
        n: load_trial_record(run_dir / "trials" / f"{n:03d}" / "measurement.json") for n in range(3)
    }
    resumed = virtual_sweep(monkeypatch, capsys, "--resume", str(run_dir), "--trials", "5")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for n, record in kept.items():  # not measured again
        assert load_trial_record(run_dir / "trials" / f"{n:03d}" / "measurement.json") == record
    summary = load_summary(run_dir)
    assert summary["trials"]["complete"] == 5
    rows = list(csv.DictReader((run_dir / "trials.csv").open()))
    assert sorted(int(r["number"]) for r in rows if int(r["number"]) >= 0) == list(range(5))
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"


def test_no_config_meeting_the_goal_exits_1_and_says_what_to_relax(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    done = virtual_sweep(
        monkeypatch, capsys, *tiny(tmp_path, trials=2, p99_ms=2.0), "--run-dir", str(run_dir)
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no config met p99 <= 2 ms" in done.stderr
    summary = load_summary(run_dir)
    assert summary["best"] is None and summary["files"]["best_config"] is None


def test_what_virtual_time_cannot_simulate_is_refused_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A model on a real backend: the virtual server has no profile to execute.
    done = virtual_sweep(monkeypatch, capsys, "--model", "resnet50", "--device", "cpu")
    assert done.returncode == 2 and "--device sim" in done.stderr, done.stderr
    # Closed-loop load: the simulator is open-loop.
    scenario = tmp_path / "closed.toml"
    scenario.write_text(
        '[model]\nname = "resnet50"\ndevice = "sim"\n[traffic]\nmode = "concurrency"\n'
    )
    done = virtual_sweep(
        monkeypatch, capsys, "--scenario", str(scenario), "--run-dir", str(tmp_path / "c")
    )
    assert done.returncode == 2 and "open-loop" in done.stderr, done.stderr


def test_ctrl_c_keeps_the_finished_trials_exits_130_and_resume_completes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from analyzer.predict.virtual import VirtualLoad

    searches = {"n": 0}
    real = VirtualLoad.find_capacity

    def interrupted_at_the_third(self: VirtualLoad, spec: Any) -> Any:
        searches["n"] += 1
        if searches["n"] == 3:  # the baseline, trial 0, then Ctrl-C in trial 1
            raise KeyboardInterrupt
        return real(self, spec)

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(VirtualLoad, "find_capacity", interrupted_at_the_third)
        done = virtual_sweep(
            monkeypatch, capsys, *tiny(tmp_path, trials=3), "--run-dir", str(run_dir)
        )
    assert done.returncode == 130, done.stdout[-3000:] + done.stderr[-3000:]
    said = " ".join(done.stdout.split())  # the console wraps long lines at 120 columns
    assert (
        f"interrupted: finished trials are kept. Resume with: perfsweep run --resume {run_dir}"
        in said
    )
    summary = load_summary(run_dir)
    assert summary["stop_reason"] == "interrupted" and summary["trials"]["complete"] == 1
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    finished = load_trial_record(run_dir / "trials" / "000" / "measurement.json")
    assert load_trial_record(run_dir / "trials" / "001" / "measurement.json")["state"] == (
        "interrupted"
    )

    resumed = virtual_sweep(monkeypatch, capsys, "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert load_trial_record(run_dir / "trials" / "000" / "measurement.json") == finished
    summary = load_summary(run_dir)
    assert summary["trials"]["complete"] == 3 and summary["trials"]["interrupted"] == 1
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"


#: ``perfsweep run ARGS`` whose third capacity search (the baseline's, trial 0's, then trial
#: 1's) writes the file ``$MARKER`` and blocks: a sweep mid-trial, there to be killed.
BLOCKS_IN_TRIAL_1 = """
import os, time
from pathlib import Path
from analyzer.predict.virtual import VirtualLoad
searches = []
real = VirtualLoad.find_capacity
def find_capacity(self, spec):
    searches.append(spec)
    if len(searches) == 3:
        Path(os.environ["MARKER"]).write_text("trial 1 is measuring")
        time.sleep(600)
    return real(self, spec)
VirtualLoad.find_capacity = find_capacity
from analyzer.cli import main
main()
"""


@pytest.mark.usefixtures("spawns")  # the sweep that is killed runs in a child process
def test_kill_9_mid_trial_keeps_the_finished_trial_and_resume_reruns_the_killed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kill -9`` of ``perfsweep run`` in trial 1's capacity search: nothing gets to clean up
    (run.json says running, trial 1 has its config but no measurement, the study holds it
    RUNNING). ``--resume`` keeps trial 0 as it was, records trial 1 as interrupted, runs its
    config again as a new trial and completes the budget."""
    import optuna
    from optuna.trial import TrialState

    from analyzer.search.study import journal_storage

    run_dir, marker, out = tmp_path / "run", tmp_path / "blocked", tmp_path / "sweep.out"
    args = ["run", "--server", "virtual", *tiny(tmp_path, trials=3), "--run-dir", str(run_dir)]
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", BLOCKS_IN_TRIAL_1, *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MARKER": str(marker)},
            start_new_session=True,  # one killpg below ends it, whatever happens
        )

    def blocked() -> bool:
        assert proc.poll() is None, f"the sweep ended before trial 1: {out.read_text()[-3000:]}"
        return marker.exists()

    try:
        wait_until(blocked, 180, "the sweep to block in trial 1")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    # What a SIGKILL leaves: nothing closed the run, trial 1 or the study.
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    assert load_trial_record(run_dir / "trials" / "000" / "measurement.json")["state"] == (
        "complete"
    )
    finished = {p.name: p.read_bytes() for p in (run_dir / "trials" / "000").iterdir()}
    killed_config = (run_dir / "trials" / "001" / "config.pbtxt").read_text()
    assert not (run_dir / "trials" / "001" / "measurement.json").exists()
    study = optuna.load_study(
        study_name=None, storage=journal_storage(str(run_dir / "study.journal"))
    )
    assert [t.number for t in study.get_trials(states=(TrialState.RUNNING,))] == [1]

    resumed = virtual_sweep(monkeypatch, capsys, "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    # Trial 0's files are those the killed run wrote, byte for byte.
    assert {p.name: p.read_bytes() for p in (run_dir / "trials" / "000").iterdir()} == finished
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


def test_a_budget_spent_before_trial_0_says_so_and_the_baseline_meets_the_goals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The baseline alone outlasts the time budget: the run says the budget ended it, names the
    budget to raise, and reports the baseline as the config that meets the goals (exit 0)."""
    flags = [*tiny(tmp_path, trials=4), "--time-budget-s", "1"]
    run_dir = tmp_path / "met"
    done = virtual_sweep(monkeypatch, capsys, *flags, "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = " ".join(done.stdout.split())
    summary = load_summary(run_dir)
    assert summary["stop_reason"] == "time_budget" and summary["trials"]["total"] == 0
    assert summary["baseline"]["meets_goals"] and summary["best"]["trial_number"] == -1
    assert summary["recommendation"]["config"] == "original"
    assert "the time budget (1 s) ran out before trial 0" in out
    assert "raise --time-budget-s" in out and "meets the goals at" in out
    assert "no trial ran" in summary["gain_text"]
    assert "The time budget ran out before trial 0" in (run_dir / "report.html").read_text()
    assert "none met" not in out and "no config met" not in out + done.stderr
    # A baseline that misses the goals too: the error names the budget, the cause measured.
    missed = virtual_sweep(
        monkeypatch,
        capsys,
        *tiny(tmp_path, trials=4, p99_ms=1.0),
        *("--time-budget-s", "1", "--run-dir", str(tmp_path / "missed")),
    )
    assert missed.returncode == 1, missed.stdout[-3000:] + missed.stderr[-3000:]
    error = " ".join(missed.stderr.split())
    assert "the time budget ran out before trial 0" in error and "raise --time-budget-s" in error


#: ``perfsweep run`` whose predict phase blocks: every simulation worker process writes its pid
#: to ``$MARKERS/<pid>`` and sleeps, as a long simulation would (the run's own process, which
#: simulates one config at a time, simulates as usual).
BLOCKS_IN_PREDICT = """
import os, time
from pathlib import Path
import analyzer.predict.capacity as capacity
run, real = os.getpid(), capacity._chain
def blocked_chain(*args, **kwargs):
    if os.getpid() == run:
        return real(*args, **kwargs)
    Path(os.environ["MARKERS"], str(os.getpid())).write_text("simulating")
    time.sleep(600)
capacity._chain = blocked_chain
from analyzer.cli import main
main()
"""


@pytest.mark.usefixtures("spawns")  # the sweep that is killed runs in a child process
def test_kill_9_in_the_predict_phase_leaves_no_simulation_worker_behind(tmp_path: Path) -> None:
    """``kill -9`` of ``perfsweep run`` while its workers simulate: each worker notices that
    its parent is gone and exits, within a bounded wait."""
    import psutil

    markers, out = tmp_path / "workers", tmp_path / "sweep.out"
    markers.mkdir()
    args = ["run", "--server", "virtual", *tiny(tmp_path, strategy="predict")]
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", BLOCKS_IN_PREDICT, *args, "--run-dir", str(tmp_path / "run")],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MARKERS": str(markers)},
            start_new_session=True,  # one killpg below ends it, whatever happens
        )

    def simulating() -> bool:
        assert proc.poll() is None, f"the sweep ended before predicting: {out.read_text()[-3000:]}"
        return len(list(markers.iterdir())) >= 2

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    workers: list[int] = []
    try:
        wait_until(simulating, 180, "two simulation workers")
        workers = [int(p.name) for p in markers.iterdir()]
        assert all(psutil.Process(w).ppid() == proc.pid for w in workers)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        wait_until(lambda: not any(alive(w) for w in workers), 30, "the workers to exit")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert not [w for w in workers if alive(w)]


def test_quiet_prints_only_the_answer_and_verbose_each_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = tiny(tmp_path, trials=2)
    quiet = virtual_sweep(monkeypatch, capsys, *flags, "-q", "--run-dir", str(tmp_path / "quiet"))
    assert quiet.returncode == 0, quiet.stdout[-3000:] + quiet.stderr[-3000:]
    best = tmp_path / "quiet" / "best" / "config.pbtxt"
    lines = " ".join(quiet.stdout.split())  # the gain sentence may wrap
    assert lines.startswith("gain over baseline: ") and lines.endswith(f"best config: {best}")
    assert quiet.stdout.count("\n") <= 3, quiet.stdout  # no live lines, no table, no paths
    verbose = virtual_sweep(
        monkeypatch, capsys, *flags, "--verbose", "--run-dir", str(tmp_path / "verbose")
    )
    assert verbose.returncode == 0, verbose.stdout[-3000:] + verbose.stderr[-3000:]
    # Each step of a measurement as it starts, then every trial in a table.
    assert re.search(r"\] +trial 0 \(\w+\): .*: capacity search from", verbose.stdout)
    assert "every trial" in verbose.stdout
    normal = virtual_sweep(monkeypatch, capsys, *flags, "--run-dir", str(tmp_path / "normal"))
    assert "capacity search from" not in normal.stdout and "every trial" not in normal.stdout
    assert f"best config:  {tmp_path / 'normal'}" in normal.stdout


def test_quiet_and_verbose_together_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    done = virtual_sweep(monkeypatch, capsys, *tiny(tmp_path), "-q", "-v")
    assert done.returncode == 2 and "--quiet or --verbose, not both" in done.stderr
