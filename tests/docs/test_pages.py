"""The README and the docs pages: short, current, linked, and their generated reference whole.

Pure: reads the pages and the source, imports the CLI and the scenario models.

- No page tells history: an issue, a stop or a commit belongs in CHANGELOG.md, a measurement's
  story in benchmarks/README.md (both exempt).
- The README fits one sitting (at most 200 lines), and shows the first command for your own
  model within its first 60 lines.
- The README's relative links name files that exist (the site's own links are checked by
  ``mkdocs build --strict``, the docs tier of ``make test``).
- The generated CLI page lists every visible option of every command and no hidden one; the
  scenario page lists every key with its environment variable, and the flags that set it.
"""

from __future__ import annotations

import enum
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer
import typer.main
from rich.console import Console
from typer import rich_utils

from tests.docs.commands import REPO_ROOT, pages

README = REPO_ROOT / "README.md"
MAX_README_LINES = 200
#: The first command for your own model must come this early in the README.
OWN_MODEL_BY_LINE = 60

#: Words that tell history rather than what is true now.
HISTORY = (
    re.compile(r"\bstop \d+", re.IGNORECASE),
    re.compile(r"\bissues? \d+", re.IGNORECASE),
    re.compile(r"\bcommit `?[0-9a-f]{7}", re.IGNORECASE),
    re.compile(r"\bbefore .*\bwork\b", re.IGNORECASE),
)


def history_in(text: str) -> list[str]:
    """``line: text`` for every line of ``text`` that tells history."""
    return [
        f"{n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if any(p.search(line) for p in HISTORY)
    ]


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_no_page_tells_history(path: Path) -> None:
    found = history_in(path.read_text(encoding="utf-8"))
    assert not found, (
        f"{path.relative_to(REPO_ROOT)} tells history (it goes in CHANGELOG.md, a measurement's "
        "story in benchmarks/README.md):\n" + "\n".join(found)
    )


def test_history_patterns_find_planted_lines() -> None:
    planted = (
        "measured at stop 23\n"
        "see issue 13\n"
        "perfsweep at commit `20d9d70`\n"
        "as it was before issue 13's work\n"
        "the run stops after 3 trials; the server keeps working\n"
    )
    assert [line.split(":")[0] for line in history_in(planted)] == ["1", "2", "3", "4"]


def test_readme_fits_one_sitting() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"
    first = next(
        (
            n
            for n, line in enumerate(lines, 1)
            if "perfsweep run --url" in line and "--model" in line
        ),
        None,
    )
    assert first is not None and first <= OWN_MODEL_BY_LINE, first
    assert "--model-control-mode=explicit" in "\n".join(lines[:OWN_MODEL_BY_LINE])


def test_readme_links_name_files_that_exist() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#")[0] for t in targets if "://" not in t and not t.startswith("#")]
    assert len(local) >= 20, local
    missing = sorted({t for t in local if not (REPO_ROOT / t).exists()})
    assert not missing, f"README.md links to what does not exist: {missing}"


# -- the generated reference pages --------------------------------------------------------------


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO_ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_hooks", module)
    spec.loader.exec_module(module)
    return module


HOOKS = _hooks()


def test_the_cli_page_lists_every_visible_option_of_every_command() -> None:
    from analyzer.cli import app

    group = typer.main.get_command(app)
    page = HOOKS.cli_reference()
    for name, command in group.commands.items():
        assert f"## perfsweep {name}\n" in page
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden:
                assert f"`{max(param.opts, key=len)}`" in page, (name, param.opts)


def test_the_cli_page_leaves_hidden_options_out() -> None:
    planted = typer.Typer()

    @planted.command("run")
    def run(
        rate: float = typer.Option(2.5, "--rate-rps", help="Offered load, req/s | per second."),
        old: float = typer.Option(0.0, "--request-rate", hidden=True),
        report: bool = typer.Option(True, "--report/--no-report"),
    ) -> None: ...

    @planted.command("other")
    def other() -> None: ...

    page = HOOKS.cli_reference(typer.main.get_command(planted))
    assert "| `--rate-rps` | number | `2.5` | Offered load, req/s \\| per second. |" in page
    assert "--request-rate" not in page
    assert "| `--report` / `--no-report` | flag | `--report` |" in page


def test_the_scenario_page_lists_every_key_with_its_variable_and_flags() -> None:
    from analyzer.config.scenario import Scenario

    page = HOOKS.scenario_reference()
    for section, field in Scenario.model_fields.items():
        model = field.annotation
        if not hasattr(model, "model_fields"):
            continue
        assert f"## [{section}]" in page
        for key, sub in model.model_fields.items():
            if hasattr(sub.annotation, "model_fields"):
                continue
            assert f"| `{key}` |" in page, f"{section}.{key}"
            assert f"`PERFSWEEP_{section.upper()}_{key.upper()}`" in page, f"{section}.{key}"
    flags = HOOKS.scenario_flags()
    assert ("run", "--p99-ms") in flags["goals.p99_ms"]
    assert ("run", "--model-repository") in flags["model.repository"]
    assert ("gate", "--input-data") in flags["input.data_file"]  # through the gate's request
    assert ("load", "--mix") in flags["traffic.classes"]  # through a helper's dict
    assert ("run", "--ssl-insecure") in flags["model.ssl_insecure"]
    assert "goals.note" not in flags  # set beside --p99-ms, not by it


def test_units_and_variables_follow_the_names() -> None:
    assert [HOOKS.unit_of(k) for k in ("p99_ms", "max_queue_delay_us", "window_s", "trials")] == [
        "ms",
        "µs",
        "s",
        "",
    ]
    assert HOOKS.env_name("goals.p99_ms") == "PERFSWEEP_GOALS_P99_MS"
    assert HOOKS.rst_to_markdown(":meth:`~a.b.Scenario.hash` and ``x``") == "`hash` and `x`"


# -- the CLI page as a table: every row whole ---------------------------------------------------

_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def table_cells(row: str) -> list[str]:
    """The cells of a Markdown table row, as a Markdown reader splits it: at each ``|`` not
    escaped (``a|b`` in a cell makes two cells; ``a\\|b`` stays one)."""
    return [c.strip() for c in _UNESCAPED_PIPE.split(row.strip().strip("|"))]


def help_default(param: Any, ctx: Any) -> str:
    """The ``[default: ...]`` that ``--help`` prints beside ``param`` (typer's own help renderer,
    to plain text on a wide console), parentheses and a flag's dashes left out; empty if none."""
    console = Console(width=10_000, color_system=None)
    with console.capture() as out:
        console.print(rich_utils._get_parameter_help(param=param, ctx=ctx, markup_mode="rich"))
    found = re.search(r"\[default: (.*?)\]\s*$", out.get().strip())
    return found.group(1).removeprefix("(").removesuffix(")") if found else ""


def _plain(text: str) -> str:
    """A cell's text as it reads: code marks, escapes and entities taken out."""
    return (
        text.replace("`", "").replace("\\|", "|").replace("&lt;", "<").replace("&gt;", ">")
        .replace("&amp;", "&")
    )  # fmt: skip


def option_rows(page: str, command: str) -> dict[str, list[str]]:
    """``{first option name: cells}`` of the option table under ``## perfsweep COMMAND``."""
    section = page.split(f"## perfsweep {command}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `-")]
    return {re.match(r"\| `([^`]+)`", row).group(1): table_cells(row) for row in rows}  # type: ignore[union-attr]


def test_every_option_row_has_four_cells_its_help_and_the_default_help_shows() -> None:
    from analyzer.cli import app

    group = typer.main.get_command(app)
    page = HOOKS.cli_reference()
    checked = defaults = 0
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        ctx = command.context_class(command, info_name=name)
        rows = option_rows(page, name)
        for param in command.params:
            if param.param_type_name != "option" or param.hidden:
                continue
            first = sorted(param.opts, key=lambda o: (not o.startswith("--"), o))[0]
            cells = rows[first]
            assert len(cells) == 4, f"perfsweep {name} {first}: {len(cells)} cells: {cells}"
            _, _, default, what = cells
            assert what, f"perfsweep {name} {first} lost its description"
            words = " ".join((param.help or "").split()).replace("\\[", "[")
            assert _plain(what).startswith(words[:40]), (name, first, what)
            shown = help_default(param, ctx)
            assert _plain(default).lstrip("-") == shown.lstrip("-"), (name, first, default, shown)
            checked += 1
            defaults += bool(shown)
    # Most options show a default in --help, and so on the page.
    assert checked > 150 and defaults > checked // 3, (checked, defaults)


class Mode(str, enum.Enum):
    """A planted choice flag's values."""

    fast = "fast"
    slow = "slow"


def test_a_choice_type_and_a_pipe_in_a_default_stay_in_their_cells() -> None:
    planted = typer.Typer()

    @planted.command("run")
    def run(
        mode: Mode = typer.Option(Mode.fast, help="How | when."),
        where: str = typer.Option("a|b", help="Where."),
        scale: float = typer.Option(None, show_default="x|y, or the scenario's s", help="S."),
        flag: bool = typer.Option(False, "--flag/--no-flag", help="F."),
    ) -> None: ...

    @planted.command("other")
    def other() -> None: ...

    group = typer.main.get_command(planted)
    rows = option_rows(HOOKS.cli_reference(group), "run")
    assert rows["--mode"] == ["`--mode`", "fast\\|slow", "`fast`", "How \\| when."]
    assert rows["--where"][2:] == ["`a\\|b`", "Where."]
    assert rows["--scale"][2] == "x\\|y, or the scenario's s"
    assert rows["--flag"][2] == "`--no-flag`"
    # The check itself: an unescaped choice list splits the row.
    assert len(table_cells("| `--mode` | fast|slow | `fast` | How. |")) == 5


# -- figures made by one command ---------------------------------------------------------------


def _figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_figures", REPO_ROOT / "docs" / "figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_figures_block_is_one_make_docs_figures_fills() -> None:
    """``make docs-figures`` rewrites each marked block from a current run: a marker it does
    not know would stay stale, and each block it knows is quoted somewhere."""
    figures = _figures()
    named = {
        name
        for path in pages()
        for name in re.findall(r"<!-- figures: (\S+) -->", path.read_text(encoding="utf-8"))
    }
    assert named == set(figures.BLOCKS), (named, set(figures.BLOCKS))
    for path in pages():
        text = path.read_text(encoding="utf-8")
        opened = re.findall(r"<!-- figures: (\S+) -->", text)
        closed = re.findall(r"<!-- /figures: (\S+) -->", text)
        assert opened == closed, path


def test_a_figures_block_keeps_the_lines_asked_for() -> None:
    figures = _figures()
    output = "config: c\npredicted capacity at p99 <= 60 ms: 1 req/s\nprofile: p"
    assert figures.kept(output, r"^predicted", last=False) == (
        "predicted capacity at p99 <= 60 ms: 1 req/s"
    )
    assert figures.kept(output, r"^predicted", last=True).endswith("\n...")
    assert figures.kept(output, None, last=True) == output
