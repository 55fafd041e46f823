"""Bad input ends `perfsweep run` with exit code 2 (input) or 3 (target) and one clear line.

Input errors end while flags and the scenario are checked: those command lines run in the test
process (``tests/support/cli.py``). A command that gets as far as the sweep (it imports the load
engine first) or opens a socket runs as a subprocess, marked ``io``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli import perfsweep_in_process
from tests.support.servers import write_model

PERFSWEEP = [sys.executable, "-c", "from analyzer.cli import main; main()"]
#: A narrow terminal: the error must still be one line.
COLUMNS = 60

RunHere = Callable[[list[str]], subprocess.CompletedProcess[str]]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFSWEEP_")}
    env["COLUMNS"] = str(COLUMNS)
    return subprocess.run(
        [*PERFSWEEP, "run", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture()
def run_here(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> RunHere:
    """``run_cli`` in the test process, from ``tmp_path``, for runs refused before the sweep."""
    monkeypatch.chdir(tmp_path)

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        return perfsweep_in_process(monkeypatch, capsys, "run", *args, columns=COLUMNS)

    return run


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
def test_bad_scenario_exits_2_with_one_line(
    run_here: RunHere,
    tmp_path: Path,
    scenario: str,
    needle: str,
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(scenario)
    done = run_here(["--scenario", str(path), "--output-dir", str(tmp_path / "out")])
    assert done.returncode == 2, done.stderr
    lines = error_lines(done)
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_slo_flag_must_be_positive(
    run_here: RunHere,
) -> None:
    done = run_here(["--model", "resnet50", "--device", "sim", "--p99-ms", "-1"])
    assert done.returncode == 2
    assert "goals.p99_ms" in error_lines(done)[0]


@pytest.mark.usefixtures("spawns")
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


def test_an_unknown_scheme_is_refused_before_anything_starts(
    run_here: RunHere, tmp_path: Path
) -> None:
    done = run_here(
        ["--url", "ftp://127.0.0.1:1", "--model", "m", "--output-dir", str(tmp_path / "o")]
    )
    assert done.returncode == 2, done.stderr
    (line,) = error_lines(done)
    assert "must start with http:// or https://" in line
    assert not (tmp_path / "o").exists()


def test_tls_flags_without_a_url_are_refused(run_here: RunHere, tmp_path: Path) -> None:
    done = run_here(["--ssl-insecure", "--output-dir", str(tmp_path / "o")])
    assert done.returncode == 2, done.stderr
    (line,) = error_lines(done)
    assert "reach a secured server at model.url (--url)" in line
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
@pytest.mark.usefixtures("spawns")
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


def test_resume_of_a_directory_that_is_not_a_run(run_here: RunHere, tmp_path: Path) -> None:
    done = run_here(["--resume", str(tmp_path)])
    assert done.returncode == 2
    assert "is not a perfsweep run directory" in error_lines(done)[0]


def assert_refuses_scheme(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = error_lines(done)
    assert "must start with http:// or https://" in line


def test_load_refuses_an_unknown_scheme(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Refused while its flags are checked, before the load engine is imported.
    monkeypatch.chdir(tmp_path)
    args = ["load", "--url", "ftp://127.0.0.1:1", "--model", "m", "--concurrency", "1"]
    assert_refuses_scheme(perfsweep_in_process(monkeypatch, capsys, *args))


@pytest.mark.usefixtures("spawns")
def test_ui_refuses_an_unknown_scheme(tmp_path: Path) -> None:
    # In a subprocess: ui checks the URL in the launcher, which may start the web server.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFSWEEP_")}
    args = ["ui", "--url", "ftp://127.0.0.1:1", "--web-port", "0"]
    done = subprocess.run(
        [*PERFSWEEP, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert_refuses_scheme(done)
