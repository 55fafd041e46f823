"""``perfsweep predict`` on a committed run directory (tests/predict/data/run-sim: a trimmed
``perfsweep run --model resnet50 --device sim --trials 2`` directory).

``perfsweep predict`` reads files and computes; it starts nothing and sends no request, so it
runs in the test process (``tests/support/cli.py``), from the repository root as a user would.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import perfsweep_in_process

RUN = Path(__file__).parent / "data" / "run-sim"
REPO_ROOT = Path(__file__).resolve().parents[2]

Perfsweep = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture()
def perfsweep(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Perfsweep:
    """``perfsweep predict ARGS``: its exit status and output."""
    monkeypatch.chdir(REPO_ROOT)  # the profile paths below are relative to it

    def predict(*args: str) -> subprocess.CompletedProcess[str]:
        return perfsweep_in_process(monkeypatch, capsys, "predict", *args)

    return predict


def test_rate_prediction_prints_prediction_and_assumptions(perfsweep: Perfsweep) -> None:
    out = perfsweep(
        str(RUN), "--rate", "300", "--max-batch-size", "8", "--max-queue-delay-us", "1000"
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert (
        "config: max_batch_size 8, max_queue_delay_us 1000, preferred 8 (default), 1 instance(s)"
        in text
    )
    assert "predicted at 300 req/s: p50" in text
    assert "batch sizes (share of executions): 1:" in text
    assert "profile: run_dir, batch sizes 1-15" in text
    # The run's three operating points (baseline and two trials) calibrate the latency the
    # server does not see, as the sweep's own predictions were.
    assert "latency offset +" in text and "calibrated on the measured operating points" in text
    assert "assumptions:" in text and "reference_server.batching.decide.decide" in text


def test_refuses_to_extrapolate_the_runs_best_config(perfsweep: Perfsweep) -> None:
    # The run's best config has max_batch_size 32; the run never executed more than 15.
    out = perfsweep(str(RUN), "--rate", "300")
    assert out.returncode == 2
    assert "covers batch sizes 1-15, but this config can execute batches of 1-32" in out.stderr
    assert "predicted" not in out.stdout


def test_capacity_as_json_and_profile_file(perfsweep: Perfsweep, tmp_path: Path) -> None:
    out = perfsweep(
        str(RUN), "--p99-ms", "60", "--max-batch-size", "8", "--instances", "2", "--json"
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kind"] == "perfsweep.prediction"
    assert doc["config"]["instance_count"] == 2 and doc["prediction"] is None
    cap = doc["capacity"]
    assert cap["capacity_rps"] > 0 and cap["at_capacity"]["p99_ms"] <= 60.0
    assert cap["upper_rps"] >= cap["capacity_rps"]
    # The profile it printed works as --profile, without the run directory.
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc["profile"]))
    again = perfsweep(
        "--profile",
        str(path),
        "--p99-ms",
        "60",
        "--max-batch-size",
        "8",
        "--instances",
        "2",
        "--json",
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["capacity"]["capacity_rps"] == cap["capacity_rps"]


def test_usage_errors_exit_2(perfsweep: Perfsweep) -> None:
    both = perfsweep(str(RUN), "--rate", "10", "--p99-ms", "5")
    assert both.returncode == 2 and "exactly one of --rate" in both.stderr
    toml = perfsweep(
        "--profile", "reference_server/zoo/profiles/resnet50_sim.toml", "--rate", "100"
    )
    assert toml.returncode == 2 and "give --max-batch-size" in toml.stderr
    bad = perfsweep(
        "--profile",
        "reference_server/zoo/profiles/resnet50_sim.toml",
        "--rate",
        "100",
        "--max-batch-size",
        "8",
        "--preferred",
        "16",
    )
    assert (
        bad.returncode == 2
        and "--preferred-batch-size: each size must be between 1 and" in bad.stderr
    )


def test_bursty_arrivals_are_simulated_and_the_run_calibrates_with_its_own(
    perfsweep: Perfsweep,
) -> None:
    """The same config under the run's Poisson arrivals and under bursts: the bursts cost
    capacity, and the latency offset is calibrated with the arrivals the run measured with
    (Poisson), not the ones asked about."""
    config = ["--p99-ms", "60", "--max-batch-size", "8", "--max-queue-delay-us", "1000"]
    answers = {}
    for arrival in ("poisson", "mmpp:3@2,0.5@4", "gamma:cv=2"):
        out = perfsweep(str(RUN), *config, "--arrival", arrival, "--json")
        assert out.returncode == 0, out.stderr
        answers[arrival] = json.loads(out.stdout)
    poisson = answers["poisson"]
    assert poisson["arrival"] == "poisson"
    offsets = {a["profile"]["latency_offset_ms"] for a in answers.values()}
    assert len(offsets) == 1, offsets  # one calibration, on the run's own arrivals
    capacity = {k: a["capacity"]["capacity_rps"] for k, a in answers.items()}
    assert capacity["mmpp:3@2,0.5@4"] < 0.8 * capacity["poisson"], capacity
    assert capacity["gamma:cv=2"] < capacity["poisson"], capacity
    text = perfsweep(str(RUN), *config, "--arrival", "mmpp:3@2,0.5@4")
    assert "arrivals: mmpp (x3 for 2 s, x0.5 for 4 s, rates relative)" in text.stdout


def test_a_bad_arrival_exits_2_before_any_simulation(perfsweep: Perfsweep) -> None:
    out = perfsweep(str(RUN), "--p99-ms", "60", "--arrival", "bursty")
    assert out.returncode == 2
    assert "unknown arrival process 'bursty'" in out.stderr
