"""Bad input ends `perfsweep run` with exit code 2 (input) or 3 (target) and one clear line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import write_model

pytestmark = pytest.mark.usefixtures("spawns")

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
    # The run never started: no live view (empty table, "best so far") and no run left behind.
    assert "best so far" not in done.stdout and "finished trials" not in done.stdout, done.stdout
    assert not list(tmp_path.glob("*/run.json")) and not list(tmp_path.glob("*/scenario.toml"))


def test_https_url_is_refused_before_anything_starts(tmp_path: Path) -> None:
    done = run_cli(
        ["--url", "https://127.0.0.1:1", "--model", "m", "--output-dir", str(tmp_path / "o")],
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    (line,) = error_lines(done)
    assert "https:// is not supported" in line
    assert not (tmp_path / "o").exists()


SEQUENCE_MODEL = """
name: "stateful"
backend: "simulated"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [16] }
output { name: "y" data_type: TYPE_FP32 dims: [4] }
sequence_batching { max_sequence_idle_microseconds: 5000000 }
parameters { key: "profile" value { string_value: "resnet50_sim" } }
"""

ENSEMBLE_MODEL = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [16] }
output { name: "y" data_type: TYPE_FP32 dims: [4] }
ensemble_scheduling {
  step { model_name: "inner" model_version: -1
         input_map { key: "x" value: "x" } output_map { key: "y" value: "y" } }
}
"""


@pytest.mark.parametrize(
    ("name", "config", "needle"),
    [("stateful", SEQUENCE_MODEL, "sequence"), ("pipeline", ENSEMBLE_MODEL, "ensemble")],
)
def test_models_perfsweep_cannot_tune_are_refused_before_the_server_starts(
    tmp_path: Path, name: str, config: str, needle: str
) -> None:
    write_model(tmp_path / "repo", name, config)
    out = tmp_path / "out"
    done = run_cli(
        ["--model-repository", str(tmp_path / "repo"), "--model", name, "--device", "sim",
         "--output-dir", str(out)],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = error_lines(done)
    assert needle in line and "tune" in line, line
    assert not out.exists()  # no server was started, no run written


def test_resume_of_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    done = run_cli(["--resume", str(tmp_path)], tmp_path)
    assert done.returncode == 2
    assert "is not a perfsweep run directory" in error_lines(done)[0]


@pytest.mark.parametrize(
    "args",
    [
        ["load", "--url", "https://127.0.0.1:1", "--model", "m", "--concurrency", "1"],
        ["ui", "--url", "https://127.0.0.1:1", "--web-port", "0"],
    ],
    ids=["load", "ui"],
)
def test_every_command_refuses_https(tmp_path: Path, args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFSWEEP_")}
    done = subprocess.run(
        [*PERFSWEEP, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = error_lines(done)
    assert "https:// is not supported" in line
