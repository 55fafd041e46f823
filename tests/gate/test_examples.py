"""The CI examples and the dogfood target stay in step with ``perfsweep gate``'s options.

The recipe for a user's own model (``examples/ci/gate-own-model.sh``, which both CI files run)
is run against a real Triton in ``test_ci_recipe.py``; here its files are read.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
import yaml

from analyzer.cli import app

REPO_ROOT = Path(__file__).resolve().parents[2]
CI = REPO_ROOT / "examples" / "ci"
#: perfsweep's own gate: the demo server, measured by perfsweep gate command lines.
FILES = [
    CI / "dogfood" / "github-actions.yml",
    CI / "dogfood" / "gitlab-ci.yml",
    REPO_ROOT / "Makefile",
]
#: The user's own model: Triton as a service, the steps in the script.
OWN_MODEL = [CI / "github-actions.yml", CI / "gitlab-ci.yml"]
SCRIPT = CI / "gate-own-model.sh"


def gate_options() -> set[str]:
    group = typer.main.get_command(app)
    command = group.commands["gate"]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in param.opts if opt.startswith("--")}


def gate_invocations(text: str) -> list[list[str]]:
    """Flags of every ``perfsweep gate`` command line (backslash continuations joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [
        re.findall(r"(?<!\S)--[a-z0-9-]+", line)
        for line in re.findall(r"perfsweep gate .*", joined)
    ]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_examples_use_only_real_gate_options(path: Path) -> None:
    invocations = gate_invocations(path.read_text())
    assert invocations, f"{path} runs no perfsweep gate"
    known = gate_options()
    for flags in invocations:
        assert set(flags) <= known, set(flags) - known


@pytest.mark.parametrize("path", FILES[:2], ids=lambda p: p.name)
def test_examples_are_valid_yaml_that_writes_junit(path: Path) -> None:
    assert isinstance(yaml.safe_load(path.read_text()), dict)
    assert "--junit" in path.read_text()


def test_the_recipe_script_passes_only_real_gate_options() -> None:
    # The gate's arguments: from the array's start to the command that runs it.
    block = SCRIPT.read_text().split("args=(", 1)[1].split('exec "$PERFSWEEP" gate', 1)[0]
    flags = set(re.findall(r"(?<![\w-])--[a-z0-9-]+", block))
    assert {"--url", "--model", "--p99-ms", "--baseline", "--max-regression"} <= flags
    assert flags <= gate_options(), flags - gate_options()


@pytest.mark.parametrize("path", OWN_MODEL, ids=lambda p: p.name)
def test_own_model_files_start_triton_in_explicit_mode_and_run_the_recipe(path: Path) -> None:
    text = path.read_text()
    document = yaml.safe_load(text)
    assert isinstance(document, dict)
    assert "tritonserver --model-repository=" in " ".join(text.split())
    assert "--model-control-mode=explicit" in text
    assert "bash ci/gate-own-model.sh" in text
    # Every setting the file gives the script is one the script reads.
    settings = set(re.findall(r"^\s+([A-Z_]+): ", text, re.MULTILINE))
    read = set(re.findall(r"\$\{([A-Z_]+)[:}]", SCRIPT.read_text()))
    assert settings - {"GH_TOKEN", "MODEL_REPOSITORY", "TRITON_IMAGE"} <= read, settings - read


def test_readme_and_ci_reference_the_gate() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert "## CI performance gates" in readme
    assert "examples/ci/github-actions.yml" in readme and "examples/ci/gitlab-ci.yml" in readme
    assert "make gate-dogfood" in (REPO_ROOT / ".ci" / "run").read_text()
