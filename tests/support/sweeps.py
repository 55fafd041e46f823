"""``perfsweep`` as tests and benchmarks drive it: the small sweep's scenario (its whole run,
baseline, a few tpe trials and one validation check, takes well under a minute), one ``perfsweep
run`` or ``perfsweep load`` as a child process, and what a run recommends, as a repository tree."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

#: ``perfsweep`` as a child process, from this interpreter.
CLI = (sys.executable, "-c", "from analyzer.cli import main; main()")

_SMALL = """
objective = "throughput"
[traffic]
min_rate_rps = 5.0
start_rps = 40.0
max_rate_rps = {max_rate_rps}
[goals]
p99_ms = {p99_ms}
max_error_rate = 0.01
[space]
max_batch_size = [1, 8]
max_queue_delay_us = [0, 2000]
delay_steps = 2
instance_count = [1, 2]
[budget]
trials = {trials}
warmup_s = 0.5
window_s = 0.5
min_requests = 60
capacity_resolution = 0.3
validate_top = {validate_top}
validate_repeats = 1
validate_window_factor = 1.0
[search]
strategy = "tpe"
"""


def small_scenario(
    trials: int = 2,
    max_rate_rps: float = 300.0,
    p99_ms: float = 300.0,
    model: str | None = None,
    validate_top: int = 1,
) -> str:
    """The small sweep's scenario TOML (``model``: a ``[model] name``, else the command's;
    ``validate_top`` 0: no validation phase, for tests that assert nothing of it)."""
    text = _SMALL.format(
        trials=trials, max_rate_rps=max_rate_rps, p99_ms=p99_ms, validate_top=validate_top
    )
    return f'{text}[model]\nname = "{model}"\n' if model else text


def sweep(
    repo: Path, work: Path, scenario: str, *flags: str, name: str = "run"
) -> tuple[Path, float]:
    """``perfsweep run --scenario <scenario> --model-repository <repo> <flags>`` (the server's
    and the model's flags), its scenario and run directory ``name`` under ``work``: the run
    directory and the run's wall time (RuntimeError with its output when it fails)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "scenario.toml").write_text(scenario)
    run_dir = work / name
    t0 = time.monotonic()
    done = subprocess.run(
        [
            *CLI,
            *("run", "--scenario", str(work / "scenario.toml"), "--run-dir", str(run_dir)),
            *("--model-repository", str(repo), "--no-report", *flags),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"perfsweep run {' '.join(flags)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return run_dir, time.monotonic() - t0


def load(url: str, out: Path, *flags: str) -> dict[str, Any]:
    """``perfsweep load --url <url> <flags>``: its ``--output`` document (RuntimeError with its
    output when it fails; exit 1, ``--find-capacity`` finding no rate that meets the goals, is
    a result)."""
    done = subprocess.run(
        [*CLI, "load", "--url", url, "--output", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"perfsweep load failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return dict(json.loads(out.read_text()))


def recommended(run_dir: Path, model: str | None = None) -> Path:
    """The config.pbtxt a run recommends (``best/``: its winner or the config it kept; else
    ``baseline/``), model ``model``'s for a run over several (a pipeline's stages, a mix)."""
    folder = run_dir / ("best" if (run_dir / "best").exists() else "baseline")
    return folder / model / "config.pbtxt" if model else folder / "config.pbtxt"


def found(run_dir: Path, model: str | None = None) -> Path:
    """The config.pbtxt a run's search found: its winner whether the run adopted it (``best/``)
    or kept the model's own config because the validation could not call the gain significant
    (the winner is then in ``candidate/``); model ``model``'s for a run over several."""
    if (run_dir / "candidate").exists():
        folder = run_dir / "candidate"
        return folder / model / "config.pbtxt" if model else folder / "config.pbtxt"
    return recommended(run_dir, model)


def assemble(repo: Path, configs: dict[str, Path], into: Path) -> Path:
    """A copy of ``repo`` with each model's config.pbtxt replaced by ``configs``'."""
    shutil.copytree(repo, into)
    for model, path in configs.items():
        shutil.copy(path, into / model / "config.pbtxt")
    return into


def virtual_sweep(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> subprocess.CompletedProcess[str]:
    """``perfsweep run --server virtual ARGS`` in the test process: the whole command (flags,
    scenario, run directory, records, report, exit status) against the reference server's
    simulated device simulated in virtual time (:mod:`analyzer.predict.virtual`), in seconds,
    with no process or socket. Answers as ``subprocess.run(..., capture_output=True)`` would."""
    from tests.support.cli import perfsweep_in_process

    monkeypatch.setenv("COLUMNS", "200")  # the console's lines unwrapped, as a wide terminal
    return perfsweep_in_process(
        monkeypatch, capsys, "run", "--server", "virtual", *args, columns=200
    )
