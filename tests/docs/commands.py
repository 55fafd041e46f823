"""The ``perfsweep ...`` command lines a page shows, and whether the CLI parses them.

Pure: reads Markdown files, builds the typer app's click command tree and runs click's own
parser on each line (no command is invoked, no option value is converted or checked).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = REPO_ROOT / "docs"

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
#: A command line in a code block: at the start of a line, after an optional shell prompt.
_LINE = re.compile(r"^(?:\$ )?(perfsweep \S.*)$")


@dataclass(frozen=True)
class CommandLine:
    """One ``perfsweep ...`` command line of a page, where it is and its words."""

    path: Path
    line: int
    text: str

    def argv(self) -> list[str]:
        """The words after ``perfsweep``: shell quoting and comments removed, cut at a pipe,
        ``...`` (the page's elision) left out."""
        words = shlex.split(self.text, comments=True)
        if "|" in words:
            words = words[: words.index("|")]
        return [w for w in words[1:] if w not in ("...", "…")]

    def where(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}: {self.text}"


def pages() -> list[Path]:
    """README.md and every hand-written page of the docs site."""
    return [REPO_ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def command_lines(path: Path, commands: set[str]) -> Iterator[CommandLine]:
    """Every ``perfsweep <command> ...`` line of ``path``: in code blocks (backslash
    continuations joined) and in inline code. Output that starts with ``perfsweep`` (``perfsweep
    run: model ...``) names no command and is skipped."""
    text = path.read_text(encoding="utf-8")
    for block in _FENCE.finditer(text):
        start = text.count("\n", 0, block.start(1)) + 1
        lines = block.group(1).split("\n")
        i = 0
        while i < len(lines):
            first = i
            joined = lines[i]
            while joined.endswith("\\") and i + 1 < len(lines):
                i += 1
                joined = joined[:-1] + " " + lines[i].strip()
            i += 1
            match = _LINE.match(joined)
            if match and _names_command(match.group(1), commands):
                yield CommandLine(path, start + first, match.group(1))
    outside = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for span in _INLINE.finditer(outside):
        code = span.group(1).strip()
        if code.startswith("perfsweep ") and _names_command(code, commands):
            yield CommandLine(path, outside.count("\n", 0, span.start()) + 1, code)


def _names_command(text: str, commands: set[str]) -> bool:
    words = text.split()
    return len(words) > 1 and words[1] in commands


def parse_error(group: Any, argv: list[str]) -> str | None:
    """Why the CLI refuses ``argv`` (an unknown option, a missing value, an extra argument), or
    None. Click's parser alone runs: values are not converted, so placeholders (``DIR``) pass,
    but every option must be one the command has."""
    name, *rest = argv
    command = group.commands.get(name)
    if command is None:
        return f"no command {name!r}"
    # A context of our own: make_context(resilient_parsing=True) would swallow unknown options.
    ctx = command.context_class(command, info_name=name)
    parser = command.make_parser(ctx)
    try:
        _, extra, _ = parser.parse_args(args=list(rest))
    except Exception as exc:  # click's UsageError family, typer's or click's own copy
        return f"{type(exc).__name__}: {exc}"
    if extra and not ctx.allow_extra_args:
        return f"unexpected extra argument(s): {' '.join(extra)}"
    return None


def command_names(group: Any) -> set[str]:
    return set(group.commands)


def split_words(text: str) -> list[str]:
    """``shlex.split`` as the lines are read (exposed for the tests' planted lines)."""
    return shlex.split(text, comments=True)
