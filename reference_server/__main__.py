"""``python -m reference_server``: serve a model repository over KServe v2 HTTP and gRPC.

Flags follow ``tritonserver`` where one exists (``--model-repository``, ``--load-model``,
``--http-port``, ``--grpc-port``, ``--metrics-port``, ``--http-max-input-size``,
``--cache-config``, ``--rate-limit``, ``--grpc-use-ssl[-mutual]`` and the ``--grpc-*-cert``/key
files, ``--http-restricted-api``, ``--grpc-restricted-protocol``). Exit status
(as ``perfsweep serve``): 0 after a clean shutdown, 2 for bad input (repository path, model
config, option values), 3 when the server cannot start otherwise (e.g. a port in use); the
message says what to fix.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from reference_server.app import ServerOptions, run_server
from reference_server.core.errors import Code, ServerError
from reference_server.frontends.http import DEFAULT_MAX_INPUT_SIZE, DEFAULT_READ_TIMEOUT_S


def triton_bool(text: str) -> bool:
    """A ``tritonserver`` boolean value: true/on/1 or false/off/0, any case."""
    value = text.lower()
    if value in ("true", "on", "1"):
        return True
    if value in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"invalid value for bool option: {text} (use true or false)")


class _GrpcSsl(argparse.Action):
    """``--grpc-use-ssl`` and ``--grpc-use-ssl-mutual`` in command-line order, as tritonserver
    reads them into ``grpc_ssl = (use_ssl, mutual)``.

    The mutual flag turns TLS on whatever its value (``--grpc-use-ssl-mutual=false`` is TLS
    without client certificates); a later ``--grpc-use-ssl=false`` turns TLS off again.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        use_ssl, mutual = namespace.grpc_ssl
        if option_string == "--grpc-use-ssl":
            use_ssl = bool(values)
        else:
            use_ssl, mutual = True, bool(values)
        namespace.grpc_ssl = (use_ssl, mutual)


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (kept separate so tests can read its defaults)."""
    parser = argparse.ArgumentParser(
        prog="python -m reference_server",
        description="A Triton-compatible dynamic-batching inference server (KServe v2).",
    )
    parser.add_argument(
        "--model-repository",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="model repository directory (repeatable); omit to serve a bundled --model (resnet50)",
    )
    parser.add_argument(
        "--model",
        "--load-model",
        dest="models",
        action="append",
        default=[],
        metavar="NAME",
        help="model to load at startup (repeatable; default: every model in the repositories)",
    )
    parser.add_argument(
        "--model-control-mode",
        choices=("explicit", "none"),
        default="explicit",
        help="explicit: the repository API loads/unloads (default); none: load/unload refused",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--http-port", type=int, default=8000, help="0 = a free port")
    parser.add_argument("--grpc-port", type=int, default=8001, help="0 = a free port")
    parser.add_argument("--metrics-port", type=int, default=8002, help="0 = a free port")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda", "sim"), default="auto")
    parser.add_argument(
        "--cache-size",
        "--response-cache-byte-size",
        dest="cache_size",
        type=int,
        default=0,
        metavar="BYTES",
        help="response cache size; 0 = off (--response-cache-byte-size: Triton's old name)",
    )
    parser.add_argument(
        "--cache-config",
        dest="cache_config",
        action="append",
        default=[],
        metavar="NAME,SETTING=VALUE",
        help="a response cache setting, as tritonserver: --cache-config=local,size=BYTES "
        "(repeatable, one setting each; not with --cache-size)",
    )
    parser.add_argument(
        "--rate-limit",
        type=str.lower,
        choices=("off", "execution_count"),
        default="off",
        help="off: ignore instance rate_limiter sections (default, as Triton); execution_count: "
        "instances wait for their resources, lower priority runs more often",
    )
    parser.add_argument(
        "--rate-limit-resource",
        dest="rate_limit_resources",
        action="append",
        default=[],
        metavar="NAME:COUNT[:DEVICE]",
        help="copies of a rate-limiter resource (repeatable; no DEVICE = every device); "
        "default: the largest count any instance asks for",
    )
    parser.add_argument(
        "--http-max-input-size",
        type=int,
        default=DEFAULT_MAX_INPUT_SIZE,
        metavar="BYTES",
        help="largest JSON request header or raw body (default 64 MiB)",
    )
    parser.add_argument(
        "--http-read-timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT_S,
        metavar="SECONDS",
        help="answer 408 to a request body that sends nothing this long (default 60; "
        "Triton has no such timeout)",
    )
    parser.add_argument(
        "--log-verbose", type=int, default=0, metavar="N", help="0 warnings, 1 info, 2 debug"
    )
    _add_security_flags(parser)
    return parser


def _add_security_flags(parser: argparse.ArgumentParser) -> None:
    """TLS for gRPC and restricted API groups, with tritonserver's names and formats."""
    parser.set_defaults(grpc_ssl=(False, False))
    parser.add_argument(
        "--grpc-use-ssl",
        action=_GrpcSsl,
        type=triton_bool,
        metavar="BOOL",
        help="serve gRPC over TLS only (needs --grpc-server-cert and --grpc-server-key)",
    )
    parser.add_argument(
        "--grpc-use-ssl-mutual",
        action=_GrpcSsl,
        type=triton_bool,
        metavar="BOOL",
        help="TLS, and require client certificates signed by --grpc-root-cert (turns TLS on "
        "even when false, as tritonserver)",
    )
    for flag, what in (
        ("--grpc-server-cert", "the gRPC server's PEM certificate (chain)"),
        ("--grpc-server-key", "the gRPC server's PEM private key"),
        ("--grpc-root-cert", "PEM CA certificate that client certificates must be signed by"),
    ):
        parser.add_argument(flag, type=Path, metavar="FILE", help=f"{what}; used with TLS only")
    groups = "health, metadata, inference, shared-memory, model-config, model-repository, "
    groups += "statistics, trace, logging"
    parser.add_argument(
        "--http-restricted-api",
        dest="http_restricted_apis",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help=f"answer 403 to requests of these APIs without the header KEY: VALUE (repeatable; "
        f"APIs: {groups})",
    )
    parser.add_argument(
        "--engine-setting",
        dest="engine_settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine setting of the bundled generative model (vLLM's names, e.g. "
        "max_num_seqs=16), as vllm serve takes them on its command line (repeatable)",
    )
    parser.add_argument(
        "--grpc-restricted-protocol",
        dest="grpc_restricted_protocols",
        action="append",
        default=[],
        metavar="PROTOCOL[,PROTOCOL...]:KEY=VALUE",
        help="end calls of these protocols UNAVAILABLE without the metadata "
        "triton-grpc-protocol-KEY: VALUE (repeatable; protocols as for --http-restricted-api)",
    )


def _watch_parent() -> None:
    """Stop (SIGTERM to itself) once the process named by ``PERFSWEEP_PARENT_PID`` is gone.

    perfsweep sets it for the servers it manages, so that a ``kill -9`` of perfsweep never
    leaves an orphan serving (Linux's PR_SET_PDEATHSIG covers only the parent *thread*).
    """
    raw = os.environ.get("PERFSWEEP_PARENT_PID", "")
    if not raw.isdigit():
        return

    def watch(parent: int) -> None:
        while os.getppid() == parent:  # re-parented once the parent died
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, args=(int(raw),), name="parent-watchdog", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, run the server until SIGINT/SIGTERM, return the exit status."""
    args = build_parser().parse_args(argv)
    _watch_parent()
    try:
        options = ServerOptions(
            model_repositories=tuple(args.model_repository),
            models=tuple(args.models),
            host=args.host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            device=args.device,
            cache_size_bytes=args.cache_size,
            max_input_size_bytes=args.http_max_input_size,
            read_timeout_s=args.http_read_timeout,
            log_verbosity=args.log_verbose,
            model_control_mode=args.model_control_mode,
            rate_limit=args.rate_limit,
            rate_limit_resources=tuple(args.rate_limit_resources),
            cache_config=tuple(args.cache_config),
            grpc_use_ssl=args.grpc_ssl[0],
            # Without TLS the mutual flag means nothing (tritonserver ignores it then too).
            grpc_use_ssl_mutual=args.grpc_ssl[0] and args.grpc_ssl[1],
            grpc_server_cert=args.grpc_server_cert,
            grpc_server_key=args.grpc_server_key,
            grpc_root_cert=args.grpc_root_cert,
            http_restricted_apis=tuple(args.http_restricted_apis),
            grpc_restricted_protocols=tuple(args.grpc_restricted_protocols),
            engine_settings=tuple(args.engine_settings),
        )
        run_server(options)
    except ServerError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2 if exc.code in (Code.INVALID_ARG, Code.NOT_FOUND) else 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
