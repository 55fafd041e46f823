"""``perfsweep gate`` end to end: the real command measuring a real reference server.

The models are simulated devices with jitter-free profiles written into temporary repositories,
so "slow" is planted (a device time far beyond what the offered rate allows), not hoped for.
Bounds are loose: the 2-core CI machine is shared with other tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.load.refserver import RefServer, write_sim_model

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.usefixtures("spawns"), pytest.mark.slow]

#: One short measurement per repeat: 0.5 s warm-up + 2 windows of 1 s at 20 req/s.
FAST_LOAD = ["--rate-rps", "20", "--warmup-s", "0.5", "--window-s", "1", "--windows", "2"]


def perfsweep(*args: str, cwd: Path, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("GITHUB_STEP_SUMMARY", None)
    return subprocess.run(
        [sys.executable, "-c", "from analyzer.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=cwd,
        env=env,
    )


def repository(root: Path, device_ms: float) -> Path:
    write_sim_model(root, "m", device_ms=device_ms)
    return root


def junit_cases(path: Path) -> dict[str, bool]:
    """Test case name -> failed."""
    cases = ET.parse(path).getroot().iter("testcase")
    return {c.get("name", ""): c.find("failure") is not None for c in cases}


def test_gate_passes_on_the_reference_server_and_a_slowed_profile_fails(tmp_path: Path) -> None:
    fast = repository(tmp_path / "fast", device_ms=2.0)
    slow = repository(tmp_path / "slow", device_ms=80.0)  # 20 req/s need <= 50 ms per request
    common = ["--model", "m", "--device", "sim", "--p99-ms", "150", *FAST_LOAD, "--repeats", "3"]

    ok = perfsweep(
        "gate", "--model-repository", str(fast), *common,
        "--output", str(tmp_path / "base.json"), "--junit", str(tmp_path / "fast.xml"),
        cwd=tmp_path,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "gate PASSED" in ok.stdout
    assert junit_cases(tmp_path / "fast.xml") == {"p99_ms <= 150": False}
    assert (tmp_path / "base.json").is_file()

    bad = perfsweep(
        "gate", "--model-repository", str(slow), *common,
        "--baseline", str(tmp_path / "base.json"), "--max-regression", "10%",
        "--junit", str(tmp_path / "slow.xml"), "--markdown", str(tmp_path / "slow.md"),
        cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert junit_cases(tmp_path / "slow.xml") == {
        "p99_ms <= 150": True,
        "throughput_rps regression <= 10%": True,  # 80 ms per request: at most 12.5 req/s
        "p99_ms regression <= 10%": True,
    }
    assert (tmp_path / "slow.md").read_text().startswith("### perfsweep gate: FAILED")
    assert "performance gate failed" in bad.stderr


def test_live_baseline_is_interleaved_and_a_slower_candidate_fails(tmp_path: Path) -> None:
    fast = repository(tmp_path / "fast", device_ms=1.0)
    slow = repository(tmp_path / "slow", device_ms=100.0)  # serves 10 of the offered 20 req/s
    # The form: --url ... --model ... --scenario FILE, criteria from its [gate] table.
    scenario = tmp_path / "gate.toml"
    scenario.write_text(
        "[traffic]\nrate_rps = 20\n[budget]\nwarmup_s = 0.5\nwindow_s = 1.0\n"
        "[gate]\nmax_regression_pct = 20\nrepeats = 3\n"
    )
    with RefServer(fast, ("m",)) as base_server, RefServer(slow, ("m",)) as cand_server:
        done = perfsweep(
            "gate", "--url", cand_server.http_url, "--baseline-url", base_server.http_url,
            "--model", "m", "--scenario", str(scenario), "--junit", str(tmp_path / "live.xml"),
            cwd=tmp_path,
        )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert junit_cases(tmp_path / "live.xml") == {
        "throughput_rps regression <= 20%": True,
        "p99_ms regression <= 20%": True,
    }
    # Rounds alternate which target goes first, so drift of the machine hits both alike.
    # Each progress line starts with the seconds since the targets were up: "[   12 s] ".
    finished = re.findall(
        r"^\[ *\d+ s\] (baseline|candidate) repeat \d+/3:", done.stdout, re.MULTILINE
    )
    assert finished == ["baseline", "candidate", "candidate", "baseline", "baseline", "candidate"]


def test_a_target_that_fails_to_start_exits_3(tmp_path: Path) -> None:
    repo = repository(tmp_path / "repo", device_ms=1.0)
    done = perfsweep(
        "gate", "--model-repository", str(repo), "--model", "missing", "--device", "sim",
        "--p99-ms", "50", *FAST_LOAD, "--repeats", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
