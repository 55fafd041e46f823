"""``perfsweep serve``: run the bundled reference server in the foreground.

Examples::

    perfsweep serve --model resnet50 --device cpu          # the bundled ResNet-50
    perfsweep serve --model-repository models/ --model m1 --model m2 --http-port 0
    perfsweep serve --model-repository models/ --cache-config local,size=1048576

It prints one line with the bound ports once everything listens and stops on Ctrl-C/SIGTERM.
Exit codes: 0 after a clean shutdown, 2 bad input (repository path, model config), 3 the server
could not start (e.g. a port in use).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from analyzer.commands.help import SECURED, Device, RateLimit, epilog
from analyzer.commands.names import command_class
from analyzer.errors import InputError, PerfsweepError, TargetError

#: The panels of serve's help.
MODELS = "Models"
LISTEN = "Listening"
BEHAVIOUR = "Server behaviour"

EXAMPLES = epilog(
    [
        ("perfsweep serve --model resnet50 --device cpu", "the bundled ResNet-50"),
        (
            "perfsweep serve --model-repository examples/mix --device sim --http-port 0",
            "a repository of simulated models, the HTTP port a free one",
        ),
        (
            "perfsweep serve --model-repository models/ --cache-config local,size=1048576",
            "with a response cache of 1 MiB",
        ),
    ],
    "It prints one line with the bound ports once everything listens, and stops on Ctrl-C or "
    "SIGTERM. Exit status: 0 after a clean shutdown, 2 bad input (repository path, model "
    "config), 3 the server could not start (e.g. a port in use).",
)


def register(app: typer.Typer) -> None:
    """Add ``perfsweep serve`` to ``app``."""

    @app.command("serve", cls=command_class("serve"), epilog=EXAMPLES)
    def serve(
        model_repository: Annotated[
            list[Path] | None,
            typer.Option(
                "--model-repository",
                metavar="<DIR>",
                help="Model repository directory (repeatable); omit for a bundled --model.",
                rich_help_panel=MODELS,
            ),
        ] = None,
        model: Annotated[
            list[str] | None,
            typer.Option(
                "--model",
                metavar="<NAME>",
                help="Model to load at startup (repeatable).",
                show_default="all",
                rich_help_panel=MODELS,
            ),
        ] = None,
        device: Annotated[
            Device,
            typer.Option(
                help="The device models run on (sim: a simulated GPU).", rich_help_panel=MODELS
            ),
        ] = Device.auto,
        host: Annotated[str, typer.Option(help="Address to bind.", rich_help_panel=LISTEN)] = (
            "127.0.0.1"
        ),
        http_port: Annotated[
            int, typer.Option(help="HTTP/REST port, 0 = a free port.", rich_help_panel=LISTEN)
        ] = 8000,
        grpc_port: Annotated[
            int, typer.Option(help="gRPC port, 0 = a free port.", rich_help_panel=LISTEN)
        ] = 8001,
        metrics_port: Annotated[
            int, typer.Option(help="Prometheus port, 0 = a free port.", rich_help_panel=LISTEN)
        ] = 8002,
        cache_size: Annotated[
            int,
            typer.Option(help="Response cache size in bytes, 0 = off.", rich_help_panel=BEHAVIOUR),
        ] = 0,
        cache_config: Annotated[
            list[str] | None,
            typer.Option(
                "--cache-config",
                metavar="<local,size=BYTES>",
                help="Response cache setting as tritonserver takes it: local,size=BYTES "
                "(repeatable, one setting each; not with --cache-size).",
                rich_help_panel=BEHAVIOUR,
            ),
        ] = None,
        rate_limit: Annotated[
            RateLimit,
            typer.Option(
                help="execution_count: honour instance rate_limiter sections (off: Triton's "
                "default).",
                rich_help_panel=BEHAVIOUR,
            ),
        ] = RateLimit.off,
        rate_limit_resource: Annotated[
            list[str] | None,
            typer.Option(
                "--rate-limit-resource",
                metavar="<NAME:COUNT[:DEVICE]>",
                help="NAME:COUNT[:DEVICE] copies of a rate-limiter resource "
                "(repeatable; no DEVICE = every device).",
                rich_help_panel=BEHAVIOUR,
            ),
        ] = None,
        http_max_input_size: Annotated[
            int,
            typer.Option(
                help="Largest JSON request header or raw body, bytes.", rich_help_panel=BEHAVIOUR
            ),
        ] = 2**26,
        http_read_timeout: Annotated[
            float | None,
            typer.Option(
                help="Seconds a request body may stall before the server answers 408 "
                "(Triton has no such timeout).",
                show_default="60",
                rich_help_panel=BEHAVIOUR,
            ),
        ] = None,
        log_verbose: Annotated[
            int, typer.Option(help="0 warnings, 1 info, 2 debug.", rich_help_panel=BEHAVIOUR)
        ] = 0,
        grpc_use_ssl: Annotated[
            bool,
            typer.Option(
                "--grpc-use-ssl", help="gRPC over TLS (Triton's flag).", rich_help_panel=SECURED
            ),
        ] = False,
        grpc_use_ssl_mutual: Annotated[
            bool,
            typer.Option(
                "--grpc-use-ssl-mutual",
                help="gRPC over TLS with client certificates signed by --grpc-root-cert.",
                rich_help_panel=SECURED,
            ),
        ] = False,
        grpc_server_cert: Annotated[
            Path | None,
            typer.Option(help="PEM certificate of the gRPC server.", rich_help_panel=SECURED),
        ] = None,
        grpc_server_key: Annotated[
            Path | None, typer.Option(help="Its PEM private key.", rich_help_panel=SECURED)
        ] = None,
        grpc_root_cert: Annotated[
            Path | None,
            typer.Option(
                help="PEM CA of client certificates (mutual TLS).", rich_help_panel=SECURED
            ),
        ] = None,
        http_restricted_api: Annotated[
            list[str] | None,
            typer.Option(
                "--http-restricted-api",
                metavar="<GROUPS:KEY=VALUE>",
                help="GROUP[,GROUP]:KEY=VALUE: these APIs answer 403 without the header "
                "(Triton's groups: health, metadata, inference, shared-memory, model-config, "
                "model-repository, statistics, trace, logging); repeatable.",
                rich_help_panel=SECURED,
            ),
        ] = None,
        grpc_restricted_protocol: Annotated[
            list[str] | None,
            typer.Option(
                "--grpc-restricted-protocol",
                metavar="<GROUPS:KEY=VALUE>",
                help="GROUP[,GROUP]:KEY=VALUE for gRPC (the metadata is "
                "triton-grpc-protocol-KEY); repeatable.",
                rich_help_panel=SECURED,
            ),
        ] = None,
    ) -> None:
        """Serve models over KServe v2 HTTP and gRPC with Triton's dynamic batching."""
        # Imported here: the server pulls in grpc/aiohttp/onnxruntime, which other commands
        # (and --help) do not need.
        from reference_server.app import ServerOptions, run_server
        from reference_server.core.errors import ServerError

        try:
            options = ServerOptions(
                model_repositories=tuple(model_repository or ()),
                models=tuple(model or ()),
                host=host,
                http_port=http_port,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
                device=device.value,
                cache_size_bytes=cache_size,
                cache_config=tuple(cache_config or ()),
                rate_limit=rate_limit.value,
                rate_limit_resources=tuple(rate_limit_resource or ()),
                max_input_size_bytes=http_max_input_size,
                log_verbosity=log_verbose,
                grpc_use_ssl=grpc_use_ssl,
                grpc_use_ssl_mutual=grpc_use_ssl_mutual,
                grpc_server_cert=grpc_server_cert,
                grpc_server_key=grpc_server_key,
                grpc_root_cert=grpc_root_cert,
                http_restricted_apis=tuple(http_restricted_api or ()),
                grpc_restricted_protocols=tuple(grpc_restricted_protocol or ()),
            )
            if http_read_timeout is not None:
                options = dataclasses.replace(options, read_timeout_s=http_read_timeout)
            run_server(options)
        except ServerError as exc:
            raise startup_error(exc) from exc


def startup_error(exc: Exception) -> PerfsweepError:
    """Map a reference-server startup failure to the CLI's error (exit 2 or 3).

    Problems with what the user passed (repository path, model config, option values) are
    ``InputError``; anything else (a busy port, a backend that cannot start) is the target
    failing, ``TargetError``.
    """
    from reference_server.core.errors import Code, ServerError

    message = exc.message if isinstance(exc, ServerError) else str(exc)
    if isinstance(exc, ServerError) and exc.code in (Code.INVALID_ARG, Code.NOT_FOUND):
        return InputError(message)
    return TargetError(message)
