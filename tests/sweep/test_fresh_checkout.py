"""The bundled examples work as a fresh clone has them: only the files git tracks.

Git keeps no empty folder, so a model directory whose version folder holds nothing arrives
without it, and the server refuses the model. Each test copies the tracked files of what it
uses into a temporary directory and starts from there, never from the working tree.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from reference_server.app import ServerOptions, ServerThread
from tests.support.servers import REPO_ROOT, ChildProcess

EXAMPLES = REPO_ROOT / "examples"
#: Every model repository under examples/: a folder whose subfolders hold a config.pbtxt.
REPOSITORIES = sorted({config.parent.parent for config in EXAMPLES.glob("*/*/config.pbtxt")})


def fresh_checkout(dest: Path, *paths: str) -> Path:
    """The files git tracks under ``paths`` (relative to the repository) copied into ``dest``,
    as a clone would lay them out; ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *paths],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    files = [name for name in listed.split("\0") if name]
    assert files, f"git tracks nothing under {paths}"
    for name in files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, target)
    return dest


@pytest.mark.usefixtures("spawns", "serves")
@pytest.mark.parametrize("repository", REPOSITORIES, ids=lambda path: path.name)
def test_every_example_repository_loads_in_the_reference_server(
    repository: Path, tmp_path: Path
) -> None:
    relative = repository.relative_to(REPO_ROOT)
    copy = fresh_checkout(tmp_path, str(relative)) / relative
    models = {config.parent.name for config in copy.glob("*/config.pbtxt")}
    options = ServerOptions(model_repositories=(copy,), device="sim")
    with ServerThread(options, startup_timeout_s=60) as server:
        index = server.core.repository_index()
    ready = {entry["name"] for entry in index if entry.get("state") == "READY"}
    assert ready == models, index


@pytest.mark.usefixtures("spawns")
def test_the_mix_scenario_gets_past_loading_on_a_fresh_checkout(tmp_path: Path) -> None:
    checkout = fresh_checkout(tmp_path / "clone", "examples/mix", "scenarios/mix.toml")
    child = ChildProcess(
        [
            sys.executable,
            "-c",
            "from analyzer.cli import main; main()",
            "run",
            "--scenario",
            "scenarios/mix.toml",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        tmp_path / "run.log",
        cwd=checkout,
    )
    try:
        # The first line of a run is printed once the server has loaded every model.
        line = child.wait_line("perfsweep run: models detect, classify", timeout_s=60)
    finally:
        child.stop(timeout_s=15, signum=signal.SIGINT)
    assert "served together" in line, line
    assert "version folder" not in child.stderr(), child.tail()
