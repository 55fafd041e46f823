"""The ``perfsweep`` command line: parse flags, call one library function, map errors to exit codes.

Each sub-command lives in ``analyzer/commands/<name>.py`` and exposes ``register(app)``. Command
modules import heavy libraries (locust/gevent, optuna, onnxruntime) inside the command body, so
that ``perfsweep serve`` never monkey-patches the process with gevent and ``--help`` is fast.

Exit codes: 0 ok, 1 goal/gate not met, 2 usage or input error, 3 the target failed.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from analyzer.commands.names import Group
from analyzer.errors import PerfsweepError

#: Sub-command modules under ``analyzer.commands``, in the order ``--help`` lists them.
COMMANDS = ("run", "serve", "load", "report", "gate", "ui", "predict")

app = typer.Typer(
    name="perfsweep",
    help="Find the dynamic-batching config that serves the most traffic within a latency goal.",
    epilog="Start with: perfsweep run --model resnet50 --device sim --server virtual (a sweep "
    "in seconds, no server), then perfsweep COMMAND --help. Flags renamed for one name per "
    "concept still read their old names: docs/cli-names.md.",
    cls=Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

err_console = Console(stderr=True)


def _print_version(given: bool) -> None:
    if given:
        typer.echo(f"perfsweep {version()}")
        raise typer.Exit()


def version() -> str:
    """perfsweep's version, from the installed package's metadata."""
    from importlib import metadata

    try:
        return metadata.version("perfsweep")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print perfsweep's version and exit.",
        ),
    ] = False,
) -> None:
    """Find the dynamic-batching config that serves the most traffic within a latency goal."""


def _register_commands() -> None:
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"analyzer.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"analyzer.commands.{name}":
                continue  # command not part of this build
            raise
        module.register(app)


_register_commands()


def main() -> None:
    """Console-script entry point: run the app and turn perfsweep errors into exit codes."""
    try:
        # Without standalone mode click *returns* a typer.Exit's code instead of exiting.
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except PerfsweepError as exc:
        # soft_wrap: the message stays one line (scripts and tests grep it), whatever the width.
        # escape: a message is text, not markup ("[gate]" must print as written).
        err_console.print(
            f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
        )
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except Exception as exc:
        if _is_usage_error(exc):
            exc.show()  # type: ignore[attr-defined]
            sys.exit(2)
        raise


def _is_usage_error(exc: Exception) -> bool:
    """A bad flag or value from the command line (click's, or the copy typer >= 0.29 vendors)."""
    try:
        import click

        if isinstance(exc, click.ClickException):
            return True
    except ModuleNotFoundError:
        pass
    try:
        from typer._click.exceptions import ClickException  # no public name for it yet
    except ModuleNotFoundError:
        return False
    return isinstance(exc, ClickException)
