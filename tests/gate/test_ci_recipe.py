"""The CI recipe for a user's own model, run as CI runs it: ``examples/ci/gate-own-model.sh``
against a real Triton 2.51 (the session's, explicit model control) with the model in its
repository.

The first run has no baseline: it passes the absolute goals and writes ``result.json``, which
the second run reads as the last main-branch result. Between the two the repository's model is
changed to one whose execute sleeps far longer (a planted regression); the script's load step
reads the repository again, so the second run measures the slower model and fails the gate
(exit 1): its p99 misses the absolute goal and is a significant regression against the
baseline, both in its JUnit report.

The margins are wide for a shared machine: the fast model's execution (5 ms) is 50x below the
goal (250 ms); the slow one's (400 ms per execution) is above it for every request.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.support.real_triton import RealTriton, dynamic_batching, sleep_model_config

pytestmark = [pytest.mark.triton, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "examples" / "ci" / "gate-own-model.sh"
MODEL = "ci_gate_own_model"


def write_model(triton: RealTriton, execute_delay_ms: float) -> None:
    """The user's model as this commit holds it, in the server's repository."""
    triton.add_model(
        sleep_model_config(
            MODEL,
            max_batch_size=8,
            execute_delay_ms=execute_delay_ms,
            dynamic_batching=dynamic_batching(max_queue_delay_us=1000),
        )
    )


def gate(triton: RealTriton, workdir: Path) -> subprocess.CompletedProcess[str]:
    """The script as a CI job runs it, in ``workdir`` (baseline/ and gate/ are relative)."""
    env = {
        **os.environ,
        "TRITON_URL": f"http://{triton.http_url}",
        "MODEL": MODEL,
        "RATE_RPS": "10",
        "P99_MS": "250",
        "MIN_THROUGHPUT_RPS": "6",
        "REPEATS": "3",
        "WARMUP_S": "0.5",
        "WINDOW_S": "1",
        "WINDOWS": "2",
        "WAIT_S": "60",
        "PERFSWEEP": str(Path(sys.executable).parent / "perfsweep"),
    }
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=workdir, env=env, capture_output=True, text=True, timeout=180
    )


def failed_cases(junit: Path) -> set[str]:
    root = ET.parse(junit).getroot()
    return {
        case.get("name", "")
        for case in root.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    }


def test_the_recipe_passes_a_model_then_fails_its_planted_regression(
    real_triton: RealTriton, tmp_path: Path
) -> None:
    write_model(real_triton, execute_delay_ms=5.0)
    first = gate(real_triton, tmp_path)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-4000:]
    assert "no baseline at baseline/result.json: absolute goals only" in out
    assert "gate PASSED" in out
    assert failed_cases(tmp_path / "gate" / "junit.xml") == set()

    # main's result is the next run's baseline; the branch's model executes 80x longer.
    (tmp_path / "baseline").mkdir()
    shutil.copy(tmp_path / "gate" / "result.json", tmp_path / "baseline" / "result.json")
    write_model(real_triton, execute_delay_ms=400.0)
    second = gate(real_triton, tmp_path)
    out = second.stdout + second.stderr
    assert second.returncode == 1, out[-4000:]
    assert "gate FAILED" in out
    failed = failed_cases(tmp_path / "gate" / "junit.xml")
    # The absolute goal, and the comparison with main's result (3 repeats a side, entirely
    # apart: the smallest p the test can give, 0.05, at alpha 0.05).
    assert {"p99_ms <= 250", "p99_ms regression <= 5%"} <= failed, failed
