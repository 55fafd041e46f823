"""The command line as data: one flag per concept on every command, the old names still read,
and help a newcomer can use (panels, defaults, choices, examples that parse, ``--version``).

Pure: the typer app is built and its commands parse argument lists (``make_context``); nothing
runs, no process, no socket.
"""

from __future__ import annotations

import re
import shlex
import typing
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import typer

from analyzer.cli import COMMANDS, app
from analyzer.commands import help as cli_help
from analyzer.commands.names import NAMES, aliases_of, canonical_args
from analyzer.config.objective import OBJECTIVES
from analyzer.config.sections import InputSection, ModelSection, RunSection, SearchSection
from analyzer.config.traffic import TrafficSection
from tests.support.cli import perfsweep_in_process

REPO_ROOT = Path(__file__).resolve().parents[2]
GROUP: Any = typer.main.get_command(app)
ALIASES = [(cmd, old, name.flag) for name in NAMES for cmd, old in name.aliases]


def visible_flags(command: str) -> set[str]:
    """Every option name a command's help shows."""
    return {
        opt
        for param in GROUP.commands[command].params
        if not getattr(param, "hidden", False)
        for opt in (*param.opts, *param.secondary_opts)
        if opt.startswith("--")
    }


def parse(command: str, *args: str) -> dict[str, Any]:
    """The parameters ``perfsweep COMMAND ARGS`` would run with (nothing runs)."""
    return dict(GROUP.commands[command].make_context(command, list(args)).params)


def test_every_command_is_registered() -> None:
    assert set(GROUP.commands) == set(COMMANDS)


@pytest.mark.parametrize("name", NAMES, ids=lambda n: n.flag)
def test_each_concept_has_its_one_flag_on_exactly_the_commands_listed(name: Any) -> None:
    having = {command for command in GROUP.commands if name.flag in visible_flags(command)}
    assert having == set(name.commands), f"{name.concept}: {name.flag} on {sorted(having)}"


def test_no_help_shows_an_old_name() -> None:
    shown = {(command, flag) for command in GROUP.commands for flag in visible_flags(command)}
    for command in GROUP.commands:
        for _, old, _ in ALIASES:
            assert (command, old) not in shown, f"perfsweep {command} shows {old}"


def test_one_parameter_has_one_flag_across_commands() -> None:
    """A parameter spelled the same in two commands is the same flag in both (``rate_rps`` is
    ``--rate-rps`` everywhere), so a concept cannot drift to a second name unnoticed."""
    flags: dict[str, set[str]] = defaultdict(set)
    for command in GROUP.commands.values():
        for param in command.params:
            long = [opt for opt in param.opts if opt.startswith("--")]
            if long and not getattr(param, "hidden", False):
                flags[param.name].add(long[0])
    assert {name: f for name, f in flags.items() if len(f) > 1} == {}


@pytest.mark.parametrize(("command", "old", "flag"), ALIASES, ids=lambda x: str(x))
def test_each_old_name_still_reads_as_its_new_one(command: str, old: str, flag: str) -> None:
    assert parse(command, old, "7") == parse(command, flag, "7")
    assert parse(command, f"{old}=7") == parse(command, f"{flag}=7")
    assert parse(command, flag, "7") != parse(command)  # the flag was read at all


def test_an_old_name_is_read_only_where_an_option_may_stand() -> None:
    takes_value = {"--header", "--rate-rps"}
    aliases = {"--request-rate": "--rate-rps"}
    assert canonical_args(["--request-rate", "5"], aliases, takes_value) == ["--rate-rps", "5"]
    assert canonical_args(["--header", "--request-rate"], aliases, takes_value) == [
        "--header",
        "--request-rate",
    ]
    assert canonical_args(["--", "--request-rate"], aliases, takes_value) == [
        "--",
        "--request-rate",
    ]
    assert aliases_of("load")["--request-rate"] == "--rate-rps"


def test_the_old_grpc_form_of_load_still_parses() -> None:
    """``--url HOST:PORT --protocol grpc`` (the load to --url) and ``--stats-url`` are accepted;
    which address is which is decided in the command (its tests run it)."""
    params = parse("load", "--url", "h:8001", "--protocol", "grpc", "--stats-url", "h:8000")
    assert params["url"] == "h:8001" and params["stats_url"] == "h:8000"
    assert "--stats-url" not in visible_flags("load")


def test_docs_list_every_flag_and_old_name() -> None:
    rows = [
        line
        for line in (REPO_ROOT / "docs" / "cli-names.md").read_text().splitlines()
        if line.startswith("|")
    ]
    for name in NAMES:
        (row,) = [r for r in rows if f"`{name.flag}`" in r.split("|")[2]]
        for _, old in name.aliases:
            assert f"`{old}`" in row, f"{old} missing from the row of {name.flag}"
        for command in name.commands:
            assert command in row.split("|")[4], f"{command} missing from the row of {name.flag}"


def _literal(model: Any, field: str) -> set[str]:
    return set(typing.get_args(model.model_fields[field].annotation))


@pytest.mark.parametrize(
    ("choice", "values"),
    [
        (cli_help.Device, _literal(ModelSection, "device")),
        (cli_help.LoadProtocol, _literal(ModelSection, "protocol")),
        (cli_help.ServerKind, _literal(ModelSection, "server")),
        (cli_help.Leave, _literal(RunSection, "leave")),
        (cli_help.SearchStrategy, _literal(SearchSection, "strategy")),
        (cli_help.SharedMemory, _literal(InputSection, "shared_memory")),
        (cli_help.TraceUnit, _literal(TrafficSection, "trace_unit")),
        (cli_help.ObjectiveName, set(OBJECTIVES)),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_choices_are_the_scenarios_values(choice: Any, values: set[str]) -> None:
    assert {c.value for c in choice} == values


def examples(command: str) -> list[list[str]]:
    """The command lines of a command's examples, each as its arguments after the name."""
    epilog = GROUP.commands[command].epilog or ""
    out = []
    for line in epilog.replace("\\[", "[").splitlines():
        if "perfsweep" not in line or line.strip().startswith("#"):
            continue  # what an example does, or the exit codes
        words = shlex.split(line.strip())
        if words[:2] == ["perfsweep", command]:
            out.append(words[2:])
        elif words and "=" in words[0] and words[1:3] == ["perfsweep", command]:
            out.append(words[3:])  # VAR=... perfsweep COMMAND ...
    return out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_examples_that_parse(command: str) -> None:
    lines = examples(command)
    assert len(lines) >= 2, f"perfsweep {command} --help shows no examples"
    for args in lines:
        parse(command, *args)  # an unknown flag or a refused value raises


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_a_one_line_summary(command: str) -> None:
    summary = GROUP.commands[command].get_short_help_str(limit=200)
    first = (GROUP.commands[command].help or "").strip().split("\n\n")[0]
    assert "\n" not in first and len(first) <= 90, first
    assert summary == first


def test_the_top_level_help_lists_each_command_on_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = perfsweep_in_process(monkeypatch, capsys, "--help", columns=120).stdout
    panel = out.split("Commands")[1].split("╰")[0]
    rows = [line for line in panel.splitlines() if line.startswith("│")]
    assert [row.split()[1] for row in rows] == list(COMMANDS), panel


def test_version_prints_the_installed_version(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    done = perfsweep_in_process(monkeypatch, capsys, "--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"perfsweep {metadata.version('perfsweep')}"


def test_run_help_groups_its_options_and_shows_their_defaults(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = perfsweep_in_process(monkeypatch, capsys, "run", "--help", columns=200).stdout
    for panel in (
        cli_help.SERVER,
        cli_help.GOALS,
        cli_help.TRAFFIC,
        cli_help.DATA,
        cli_help.SEARCH,
        cli_help.OUTPUT,
        cli_help.DISTRIBUTED,
        cli_help.SECURED,
    ):
        assert re.search(rf"╭─ {panel} ─", out), panel
    flat = " ".join(out.split())
    assert "--trials <int> Search trials" in flat
    assert "[default: (20, or the scenario's budget.trials)]" in flat
    assert "[default: (predict, or the scenario's search.strategy)]" in flat
    assert "--device <auto|cpu|cuda|sim>" in flat
    assert "--search <predict|tpe|random|grid>" in flat
    assert "-q" in flat and "-v" in flat and "Examples:" in flat


@pytest.mark.parametrize("command", COMMANDS)
def test_no_flag_reads_as_taking_a_value(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = perfsweep_in_process(monkeypatch, capsys, command, "--help", columns=200).stdout
    assert "<bool>" not in out
    assert "<str>" not in " ".join(
        line for line in out.splitlines() if re.search(r"--(device|protocol|search)\b", line)
    )


@pytest.mark.parametrize(
    ("command", "grpc", "protocol_grpc"),
    # ui's --protocol names the generative users' token stream; its gRPC users are a class.
    [("run", True, True), ("ui", True, False), ("predict", False, False)],
)
def test_ssl_ca_help_fits_the_command(
    command: str,
    grpc: bool,
    protocol_grpc: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = perfsweep_in_process(monkeypatch, capsys, command, "--help", columns=200).stdout
    (line,) = [line for line in out.splitlines() if "--ssl-ca" in line]
    assert ("--protocol grpc" in line) == protocol_grpc, line
    assert ("gRPC" in line) == grpc, line


def test_mix_help_names_every_form_mix_accepts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from analyzer.config.scenario import mix_overrides

    out = perfsweep_in_process(monkeypatch, capsys, "load", "--help", columns=200).stdout
    flat = " ".join(out.split())
    assert "MODEL=RATE/s" in flat and "@P99_MS" in flat and "[[traffic.classes]]" in flat
    assert mix_overrides("a=3,b=1@40,c=20/s")["traffic.classes"][2]["rate_rps"] == 20.0


def test_one_metrics_url_rule_on_every_command() -> None:
    """``--metrics-url`` is one flag with one default on run, load, gate and ui: the ``--url``
    host's HTTP port + 2 (Triton's layout), as the generator and the dashboard compute it."""
    from analyzer.config.urls import metrics_url_of
    from analyzer.load.web.options import TargetSettings

    shown = {
        (param.help, param.show_default)
        for name in ("run", "load", "gate", "ui")
        for param in GROUP.commands[name].params
        if param.name == "metrics_url"
    }
    assert len(shown) == 1, shown
    assert [
        metrics_url_of(u)
        for u in ("http://h:8000", "127.0.0.1:9000/", "https://h:8443", "http://[::1]:8000", "h")
    ] == [
        "http://h:8002/metrics",
        "http://127.0.0.1:9002/metrics",
        "http://h:8445/metrics",
        "http://[::1]:8002/metrics",
        "http://h/metrics",
    ]
    settings = TargetSettings.from_locust("http://h:7000", None)
    assert settings.metrics_url == metrics_url_of("http://h:7000")


def test_workers_is_one_flag_that_takes_auto_on_run_and_load() -> None:
    """The dashboard's ``--workers`` is its Locust worker count, not a generator that grows."""
    having = {
        name: (param.help, param.metavar)
        for name in ("run", "load")
        for param in GROUP.commands[name].params
        if param.name == "workers"
    }
    assert set(having) == {"run", "load"} and len(set(having.values())) == 1, having
    assert parse("load", "--url", "h:1", "--model", "m", "--workers", "auto")["workers"] == "auto"


def test_load_defaults_are_the_scenarios() -> None:
    """A concept has one default: load's capacity search and windows start where a scenario
    does (``[budget] capacity_resolution`` and ``window_s``)."""
    from analyzer.config.sections import BudgetSection

    params = parse("load", "--url", "h:1", "--model", "m")
    assert params["resolution"] == BudgetSection().capacity_resolution
    assert params["window_s"] == BudgetSection().window_s
