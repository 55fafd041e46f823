"""Every ``perfsweep ...`` command line the README and the docs pages show parses against the
CLI: a renamed or removed flag breaks this test, not a reader's first command.

Pure: reads the pages and runs click's parser on each line (:mod:`tests.docs.commands`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import typer.main

from analyzer.cli import app
from tests.docs.commands import (
    REPO_ROOT,
    CommandLine,
    command_lines,
    command_names,
    pages,
    parse_error,
)

GROUP = typer.main.get_command(app)
COMMANDS = command_names(GROUP)


def test_the_pages_show_commands_of_every_kind() -> None:
    lines = [c for p in pages() for c in command_lines(p, COMMANDS)]
    shown = {c.argv()[0] for c in lines}
    assert len(lines) >= 60, len(lines)
    assert shown == COMMANDS, COMMANDS - shown  # every command is shown somewhere


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_command_line_parses(path: Path) -> None:
    refused = [
        f"{c.where()}\n    {error}"
        for c in command_lines(path, COMMANDS)
        if (error := parse_error(GROUP, c.argv())) is not None
    ]
    assert not refused, "command lines the CLI refuses:\n" + "\n".join(refused)


# -- the check finds planted mistakes -----------------------------------------------------------


def _planted(tmp_path: Path, text: str) -> list[CommandLine]:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return list(command_lines(page, COMMANDS))


def test_lines_are_found_in_blocks_with_continuations_and_inline(tmp_path: Path) -> None:
    found = _planted(
        tmp_path,
        "Run `perfsweep report RUN_DIR` later.\n\n"
        "```\n"
        "$ perfsweep run --model m \\\n"
        "    --p99-ms 50     # a comment\n"
        "perfsweep run: model m on sim (output, not a command)\n"
        "   perfsweep run sim   (a centred table title)\n"
        "perfsweep load --url u --model m | cat\n"
        "```\n",
    )
    assert [c.argv() for c in found] == [
        ["run", "--model", "m", "--p99-ms", "50"],
        ["load", "--url", "u", "--model", "m"],
        ["report", "RUN_DIR"],
    ]
    assert [c.line for c in found] == [4, 8, 1]


def test_unknown_options_missing_values_and_extra_arguments_are_refused(tmp_path: Path) -> None:
    lines = _planted(
        tmp_path,
        "```\n"
        "perfsweep run --model m --no-such-flag 3\n"
        "perfsweep run --model\n"
        "perfsweep run extra-argument\n"
        "perfsweep report RUN_DIR --output out.html\n"
        "perfsweep run --model m ... --trials 3\n"
        "```\n",
    )
    errors = [parse_error(GROUP, c.argv()) for c in lines]
    assert "--no-such-flag" in str(errors[0])
    assert "requires an argument" in str(errors[1])
    assert "extra-argument" in str(errors[2])
    assert errors[3:] == [None, None]


def test_a_hidden_alias_still_parses() -> None:
    """Renamed flags keep their old names as hidden options: lines with them parse."""
    planted = typer.Typer()

    @planted.command("run")
    def run(
        rate: float = typer.Option(0.0, "--rate-rps", "--rate"),
        old: float = typer.Option(0.0, "--request-rate", hidden=True),
    ) -> None: ...

    @planted.command("other")
    def other() -> None: ...

    group = typer.main.get_command(planted)
    assert parse_error(group, ["run", "--request-rate", "3"]) is None
    assert parse_error(group, ["run", "--rate", "3"]) is None
    assert parse_error(group, ["run", "--bogus", "3"]) is not None
