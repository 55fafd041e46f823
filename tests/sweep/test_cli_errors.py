"""Bad input ends `perfsweep run` with exit code 2 (input) or 3 (target) and one clear line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

PERFSWEEP = [sys.executable, "-c", "from analyzer.cli import main; main()"]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFSWEEP_")}
    env["COLUMNS"] = "60"  # narrow terminal: the error must still be one line
    return subprocess.run(
        [*PERFSWEEP, "run", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(
    ("scenario", "needle"),
    [
        ("[goals]\np99_ms = 50\nlatency_ms = 3\n", "unknown key 'goals.latency_ms'"),
        (
            "[space]\nmax_batch_size = [1, 8]\npreferred_batch_size = [4, 16]\n",
            "preferred size 16 is above",
        ),
        ("[goals]\np99_ms = 0\n", "goals.p99_ms"),
    ],
)
def test_bad_scenario_exits_2_with_one_line(tmp_path: Path, scenario: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(scenario)
    done = run_cli(["--scenario", str(path), "--output-dir", str(tmp_path / "out")], tmp_path)
    assert done.returncode == 2, done.stderr
    lines = error_lines(done)
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_slo_flag_must_be_positive(tmp_path: Path) -> None:
    done = run_cli(["--model", "resnet50", "--device", "sim", "--p99-ms", "-1"], tmp_path)
    assert done.returncode == 2
    assert "goals.p99_ms" in error_lines(done)[0]


def test_unreachable_url_exits_3_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = run_cli(
        ["--url", f"http://127.0.0.1:{port}", "--model", "m", "--output-dir", str(tmp_path)],
        tmp_path,
    )
    assert done.returncode == 3, done.stderr
    lines = error_lines(done)
    assert len(lines) == 1 and f"cannot reach the server at http://127.0.0.1:{port}" in lines[0]
    (run_json,) = tmp_path.glob("*/run.json")
    assert '"status": "failed"' in run_json.read_text()


def test_resume_of_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    done = run_cli(["--resume", str(tmp_path)], tmp_path)
    assert done.returncode == 2
    assert "is not a perfsweep run directory" in error_lines(done)[0]
