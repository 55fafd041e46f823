"""The CI examples and the dogfood target stay in step with ``perfsweep gate``'s options."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
import yaml

from analyzer.cli import app

REPO_ROOT = Path(__file__).resolve().parents[2]
FILES = [
    REPO_ROOT / "examples" / "ci" / "github-actions.yml",
    REPO_ROOT / "examples" / "ci" / "gitlab-ci.yml",
    REPO_ROOT / "Makefile",
]


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


def test_readme_and_ci_reference_the_gate() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert "## CI performance gates" in readme
    assert "examples/ci/github-actions.yml" in readme and "examples/ci/gitlab-ci.yml" in readme
    assert "make gate-dogfood" in (REPO_ROOT / ".ci" / "run").read_text()
