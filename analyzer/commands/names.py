"""One flag name per concept across the commands, and the other names each command reads.

:data:`NAMES` is the table: a concept, its one flag, the commands that have it, and the other
names a command reads as the flag (hidden aliases: no help shows them, a command line that uses
one works). :class:`Command` is the class of every perfsweep command: it reads an old name as the
new one before click parses, and shows a flag without a value type. ``docs/cli-names.md`` is the
same table for readers; ``tests/unit/test_cli_names.py`` keeps the two and the app in step.

The scenario keys (``[traffic] rate_rps``...) and their ``PERFSWEEP_*`` variables spell the
concepts the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from typer.core import TyperCommand, TyperGroup

__all__ = ["NAMES", "Command", "Group", "Name", "aliases_of", "canonical_args", "command_class"]


@dataclass(frozen=True)
class Name:
    """A concept's one flag.

    Attributes:
        concept: What the flag means, in a few words.
        flag: Its one name, on every command that has it.
        commands: The commands that have it.
        aliases: ``(command, old name)`` pairs: what each command still reads as ``flag``.
    """

    concept: str
    flag: str
    commands: tuple[str, ...]
    aliases: tuple[tuple[str, str], ...] = ()


NAMES: tuple[Name, ...] = (
    Name("the server's HTTP address (URL or HOST:PORT)", "--url",
         ("run", "load", "gate", "ui", "predict")),
    Name("the server's gRPC address (HOST:PORT)", "--grpc-url", ("run", "load", "gate", "ui")),
    Name("what the load speaks (http, grpc; a generative model's token stream)", "--protocol",
         ("run", "load", "gate", "ui")),
    Name("p99 latency goal, ms", "--p99-ms", ("run", "load", "gate", "predict")),
    Name("throughput goal, req/s", "--min-throughput-rps", ("run", "gate"),
         (("gate", "--min-throughput"),)),
    Name("offered request rate (open loop), req/s", "--rate-rps", ("run", "load", "gate", "predict"),
         (("load", "--request-rate"), ("predict", "--rate"))),
    Name("requests per second each dashboard user offers", "--user-rate-rps", ("ui",),
         (("ui", "--rate-per-user"),)),
    Name("a capacity search's highest rate, req/s", "--max-rate-rps", ("load",),
         (("load", "--max-rps"),)),
    Name("a capacity search's relative precision", "--capacity-resolution", ("load",),
         (("load", "--resolution"),)),
    Name("time budget of a sweep, s", "--time-budget-s", ("run",), (("run", "--time-budget"),)),
    Name("how long a --url server that stopped answering is awaited, s", "--server-wait-s",
         ("run",), (("run", "--server-wait"),)),
    Name("a directory written into", "--output-dir", ("run", "ui"), (("ui", "--log-dir"),)),
    Name("a file written", "--output", ("load", "gate", "report")),
    Name("the profile written (read back with --profile)", "--profile-output", ("predict",),
         (("predict", "--save-profile"),)),
    Name("preferred batch sizes of a config", "--preferred-batch-size", ("predict",),
         (("predict", "--preferred"),)),
    Name("instances of a config", "--instance-count", ("predict",),
         (("predict", "--instances"),)),
)  # fmt: skip


def aliases_of(command: str) -> dict[str, str]:
    """``{old name: flag}`` of every alias ``command`` reads."""
    return {old: name.flag for name in NAMES for cmd, old in name.aliases if cmd == command}


def canonical_args(
    args: Sequence[str], aliases: Mapping[str, str], takes_value: set[str]
) -> list[str]:
    """``args`` with each old option name (``--old`` or ``--old=V``) as its new one.

    Only option positions are read: the word after an option in ``takes_value`` is its value,
    and everything after ``--`` is left as it is.
    """
    out: list[str] = []
    value_next = False
    for i, arg in enumerate(args):
        if value_next:
            out.append(arg)
            value_next = False
            continue
        if arg == "--":
            out.extend(args[i:])
            break
        name, eq, value = arg.partition("=")
        name = aliases.get(name, name) if name.startswith("--") else name
        out.append(f"{name}{eq}{value}")
        value_next = not eq and name in takes_value
    return out


class Command(TyperCommand):
    """A perfsweep command: old flag names read as new ones; flags shown without a value type."""

    #: ``{old name: flag}`` this command reads (set by :func:`command_class`).
    aliases: ClassVar[Mapping[str, str]] = {}

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        takes_value = {
            opt
            for param in self.get_params(ctx)
            if not getattr(param, "is_flag", True) and not getattr(param, "count", False)
            for opt in (*param.opts, *param.secondary_opts)
        }
        result: list[str] = super().parse_args(ctx, canonical_args(args, self.aliases, takes_value))
        return result

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_untyped(super().get_params(ctx))


class Group(TyperGroup):
    """The ``perfsweep`` group: its flags (``--version``, ``--help``) shown without a type."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_untyped(super().get_params(ctx))


def _flags_untyped(params: list[Any]) -> list[Any]:
    """``params``, each flag with an empty metavar: help shows a type beside each option
    (``<bool>`` for a flag, which reads as if it took a value), a flag none."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


def command_class(command: str) -> type[Command]:
    """The :class:`Command` class of ``command`` (``cls=`` of ``app.command``)."""
    return type(f"{command.title()}Command", (Command,), {"aliases": aliases_of(command)})
