"""The flags several commands share, defined once: request data, traffic, generator, access.

Each command declares the same parameters with these types and hands them to
:func:`analyzer.config.scenario.input_overrides`, which maps them onto the scenario's ``[input]``
keys; the scenario validates them (one-line errors naming the key) and
:func:`analyzer.load.engine.engine_options` carries them to the generator. So a flag means the same
in every command, and the same as its scenario key::

    --shape IDS:128 --shape MASK:128     [input] shapes = {IDS = [128], MASK = [128]}
    --input-data data.json               [input] data_file = "data.json"
    --input-data zeros                   [input] data = "zeros"
    --batch-size 4                       [input] batch_size = 4
    --unique-payloads 10000              [input] unique_payloads = 10000
    --repeat-ratio 0.3                   [input] repeat_ratio = 0.3
    --shared-memory system               [input] shared_memory = "system"

A shape ``distribution`` has no flag (a list of weighted shapes reads better in the file).

The generator's flags (``run`` and ``gate``) map onto ``[model]`` and ``[traffic]``::

    --protocol grpc                      [model] protocol = "grpc"
    --metrics-url URL                    [model] metrics_url = "URL"
    --workers 4 | auto                   [traffic] workers = 4 | "auto"
    --expect-workers 4                   [traffic] expect_workers = 4
    --master-bind-host H / --master-port P   [traffic] master_bind_host / master_port

How a secured server is reached (``run``, ``gate``, ``load``, ``ui``, ``predict``) maps onto
``[model]``; headers are never written down (:mod:`analyzer.config.access`)::

    --grpc-url HOST:PORT                 [model] grpc_url = "HOST:PORT"
    --ssl-ca ca.pem                      [model] ssl_ca = "ca.pem"
    --ssl-cert client.pem --ssl-key client.key   [model] ssl_cert / ssl_key
    --ssl-insecure                       [model] ssl_insecure = true
    --header 'Authorization: Bearer ${TOKEN}' / --header-file FILE   (not in the file)

The traffic's shape (``run``, ``gate``, ``load``) maps onto ``[traffic]``::

    --arrival gamma:cv=2                 [traffic] arrival = "gamma:cv=2"
    --trace requests.csv                 [traffic] trace = "requests.csv"
    --trace-unit ms                      [traffic] trace_unit = "ms"
    --mix a=3,b=1                        [[traffic.classes]] name = model = "a", share = 0.75; ...

A generative model's requests (``load`` only, not in the scenario file): ``--input-tokens``,
``--output-tokens`` (a length or a distribution), or ``--dataset FILE.jsonl``; its goals
``--ttft-p99-ms`` and ``--itl-p99-ms``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from analyzer.commands.help import (
    DATA,
    DISTRIBUTED,
    GOALS,
    SECURED,
    SERVER,
    TRAFFIC,
    LoadProtocol,
    SharedMemory,
    TraceUnit,
)
from analyzer.config.scenario import (
    access_overrides,
    generator_overrides,
    input_overrides,
    mix_overrides,
    parse_shapes,
    traffic_overrides,
)
from analyzer.errors import InputError
from analyzer.measure.lengths import Lengths, parse_dataset, parse_length

__all__ = [
    "ArrivalFlag",
    "BatchSizeFlag",
    "DatasetFlag",
    "ExpectWorkersFlag",
    "GrpcUrlFlag",
    "HeaderFileFlag",
    "HeaderFlag",
    "InputDataFlag",
    "InputTokensFlag",
    "ItlP99Flag",
    "MasterBindHostFlag",
    "MasterPortFlag",
    "MetricsUrlFlag",
    "MixFlag",
    "OutputTokensFlag",
    "PadBucketsFlag",
    "PadValuesFlag",
    "ProtocolFlag",
    "RepeatRatioFlag",
    "ShapeFlag",
    "SharedMemoryFlag",
    "SslCaFlag",
    "SslCaHttpFlag",
    "SslCaUiFlag",
    "SslCertFlag",
    "SslInsecureFlag",
    "SslKeyFlag",
    "TraceFlag",
    "TraceUnitFlag",
    "TtftP99Flag",
    "UniquePayloadsFlag",
    "WorkersFlag",
    "access_overrides",
    "generative_lengths",
    "generator_overrides",
    "input_overrides",
    "mix_overrides",
    "parse_shapes",
    "traffic_overrides",
]

#: ``--shape NAME:D1,D2`` (repeatable).
ShapeFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--shape",
        metavar="<NAME:D1,D2>",
        help="Dims of an input with a variable (-1) dim, batch dim left out "
        "(repeatable; \\[input] shapes).",
        rich_help_panel=DATA,
    ),
]
#: ``--input-data random | zeros | FILE``.
InputDataFlag = Annotated[
    str | None,
    typer.Option(
        "--input-data",
        metavar="<random|zeros|FILE>",
        help="random (default), zeros, a perf_analyzer --input-data .json, an .npz (leading "
        "axis = entries), or a directory with one raw file per input (\\[input] data_file).",
        rich_help_panel=DATA,
    ),
]
#: ``--batch-size N``.
BatchSizeFlag = Annotated[
    int | None,
    typer.Option(
        "--batch-size",
        help="Samples per request (default 1; \\[input] batch_size).",
        rich_help_panel=DATA,
    ),
]
#: ``--unique-payloads N``.
UniquePayloadsFlag = Annotated[
    int | None,
    typer.Option(
        "--unique-payloads",
        help="Distinct random payloads per generator process (default 8192, fewer for large "
        "inputs; \\[input] unique_payloads).",
        rich_help_panel=DATA,
    ),
]
#: ``--repeat-ratio R``.
RepeatRatioFlag = Annotated[
    float | None,
    typer.Option(
        "--repeat-ratio",
        help="Share of random requests that repeat an earlier payload, 0..<1: the hit ratio "
        "a response cache sees (default 0; \\[input] repeat_ratio).",
        rich_help_panel=DATA,
    ),
]
#: ``--shared-memory none | system``.
SharedMemoryFlag = Annotated[
    SharedMemory | None,
    typer.Option(
        "--shared-memory",
        help="system: inputs written once into a registered system shared-memory region that "
        "each request names (the server must run on this host); default none "
        "(\\[input] shared_memory).",
        rich_help_panel=DATA,
    ),
]
#: ``--pad-buckets auto | 64,128,256``.
PadBucketsFlag = Annotated[
    str | None,
    typer.Option(
        "--pad-buckets",
        metavar="auto|L1,L2,...",
        help="Pad every request's variable dims up to the nearest of these lengths, as a client "
        "that buckets its requests does (auto: four buckets at the quartiles of the data's "
        "lengths); needs --pad-values (\\[input] pad_buckets).",
        rich_help_panel=DATA,
    ),
]
#: ``--pad-values IDS=0,MASK=0``.
PadValuesFlag = Annotated[
    str | None,
    typer.Option(
        "--pad-values",
        metavar="NAME=V,...",
        help="The value padding fills each variable input with, e.g. INPUT_IDS=0,"
        "ATTENTION_MASK=0 (\\[input] pad_values).",
        rich_help_panel=DATA,
    ),
]


# ---- the traffic's shape ---------------------------------------------------------------------

#: ``--arrival PROCESS``.
ArrivalFlag = Annotated[
    str | None,
    typer.Option(
        "--arrival",
        metavar="<PROCESS>",
        help="Open-loop arrival process: poisson (default), constant, gamma:cv=2, "
        "mmpp:4@0.5,0.25@2 (relative rate @ mean sojourn s, states in turn), "
        "ramp:start=0.5,end=1.5,period_s=60, diurnal:amplitude=0.5,period_s=60 "
        "(\\[traffic] arrival).",
        rich_help_panel=TRAFFIC,
    ),
]
#: ``--trace FILE``.
TraceFlag = Annotated[
    str | None,
    typer.Option(
        "--trace",
        metavar="<FILE>",
        help="Replay a recorded trace: .csv or .jsonl timestamps (a timestamp/time/ts/t "
        "column, _ms/_us suffix for its unit), else perf_analyzer's --request-intervals "
        "(one gap a line, microseconds); scaled to each rate, looped (\\[traffic] trace).",
        rich_help_panel=TRAFFIC,
    ),
]
#: ``--trace-unit auto | s | ms | us``.
TraceUnitFlag = Annotated[
    TraceUnit | None,
    typer.Option(
        "--trace-unit",
        help="The trace's time unit (default auto: from the column name or the format; "
        "\\[traffic] trace_unit).",
        rich_help_panel=TRAFFIC,
    ),
]

#: ``--mix a=3,b=1``.
MixFlag = Annotated[
    str | None,
    typer.Option(
        "--mix",
        metavar="<MODEL=WEIGHT,...>",
        help="Several models served together, each request sent to a model drawn by weight: "
        "MODEL=WEIGHT pairs (a=3,b=1), or MODEL=RATE/s for a model held at a rate of its own "
        "(c=20/s); each optionally with @P99_MS, that model's own p99 goal (a=3,b=1@40), "
        "else the run's (\\[\\[traffic.classes]] with model).",
        rich_help_panel=TRAFFIC,
    ),
]


# ---- generative requests: lengths and token goals -------------------------------------------

#: ``--input-tokens N | uniform:LO,HI | lognormal:mean=M,sd=S``.
InputTokensFlag = Annotated[
    str | None,
    typer.Option(
        "--input-tokens",
        metavar="<N|DIST>",
        help="Generative models: prompt length in tokens, N or a distribution "
        "(uniform:LO,HI, lognormal:mean=M,sd=S); default 128.",
        rich_help_panel=DATA,
    ),
]
#: ``--output-tokens N | DIST``.
OutputTokensFlag = Annotated[
    str | None,
    typer.Option(
        "--output-tokens",
        metavar="<N|DIST>",
        help="Generative models: tokens to generate per request, N or a distribution "
        "(as --input-tokens); default 64.",
        rich_help_panel=DATA,
    ),
]
#: ``--dataset FILE.jsonl``.
DatasetFlag = Annotated[
    Path | None,
    typer.Option(
        "--dataset",
        metavar="<FILE.jsonl>",
        help="Generative models: requests from a JSONL file, one a line: prompt (text) or "
        "input_tokens, and output_tokens (instead of --input-tokens/--output-tokens).",
        rich_help_panel=DATA,
    ),
]
#: ``--ttft-p99-ms X``.
TtftP99Flag = Annotated[
    float | None,
    typer.Option(
        "--ttft-p99-ms",
        help="Generative models: p99 time-to-first-token goal, ms.",
        rich_help_panel=GOALS,
    ),
]
#: ``--itl-p99-ms X``.
ItlP99Flag = Annotated[
    float | None,
    typer.Option(
        "--itl-p99-ms",
        help="Generative models: p99 inter-token-latency goal (over tokens), ms.",
        rich_help_panel=GOALS,
    ),
]


def generative_lengths(
    input_tokens: str | None, output_tokens: str | None, dataset: Path | None
) -> Lengths:
    """The requests' lengths the flags describe (checked: bad values end here, before any load).

    Raises:
        InputError: a distribution that does not parse, a dataset line without lengths, or a
            dataset given with length flags.
    """
    if dataset is not None:
        if input_tokens is not None or output_tokens is not None:
            raise InputError(
                "--dataset gives each request's lengths; leave out --input-tokens/--output-tokens"
            )
        try:
            text = dataset.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot read dataset {dataset}: {exc.strerror or exc}") from None
        return Lengths(dataset=parse_dataset(text, str(dataset)), source=dataset.name)
    return Lengths(
        parse_length(input_tokens or "128", "--input-tokens"),
        parse_length(output_tokens or "64", "--output-tokens"),
    )


# ---- the generator ---------------------------------------------------------------------------

#: ``--protocol http | grpc``.
ProtocolFlag = Annotated[
    LoadProtocol | None,
    typer.Option(
        "--protocol",
        help="What the load speaks (default http): grpc sends it to --grpc-url; everything "
        "else still goes over HTTP to --url. A generative model's token streams: "
        "grpc-stream, generate-stream (the default for one: http's), openai, openai-chat.",
        rich_help_panel=SERVER,
    ),
]
#: ``--metrics-url URL``.
MetricsUrlFlag = Annotated[
    str | None,
    typer.Option(
        "--metrics-url",
        help="Prometheus /metrics URL of the --url server (Triton: HTTP port + 2), for GPU "
        "utilisation, memory and power; the managed server's is found by itself.",
        rich_help_panel=SERVER,
    ),
]
#: ``--workers N | auto``.
WorkersFlag = Annotated[
    str | None,
    typer.Option(
        "--workers",
        metavar="<N|auto>",
        help="Local Locust generator processes: N, or auto (start with 1, add processes up to "
        "one per core while the generator's self-check finds it saturated); default 1 "
        "(\\[traffic] workers).",
        rich_help_panel=DISTRIBUTED,
    ),
]
#: ``--expect-workers N``.
ExpectWorkersFlag = Annotated[
    int | None,
    typer.Option(
        "--expect-workers",
        help="Be the Locust master of this many remote workers "
        "(perfsweep load --worker --master-host H) instead of generating load here.",
        rich_help_panel=DISTRIBUTED,
    ),
]
#: ``--master-bind-host H``.
MasterBindHostFlag = Annotated[
    str | None,
    typer.Option(
        "--master-bind-host",
        help="--expect-workers: address the master listens on (default 127.0.0.1).",
        rich_help_panel=DISTRIBUTED,
    ),
]
#: ``--master-port P``.
MasterPortFlag = Annotated[
    int | None,
    typer.Option(
        "--master-port",
        help="--expect-workers: the master's port (default 5557).",
        rich_help_panel=DISTRIBUTED,
    ),
]
#: ``--grpc-url HOST:PORT``.
GrpcUrlFlag = Annotated[
    str | None,
    typer.Option(
        "--grpc-url",
        metavar="<HOST:PORT>",
        help="The server's gRPC address (default: its HTTP port + 1, Triton's layout).",
        rich_help_panel=SERVER,
    ),
]


# ---- a secured server ------------------------------------------------------------------------

_SSL_CA = "CA (PEM) that signs the server's certificate, for an https:// --url"
#: ``--ssl-ca FILE`` of a command with ``--protocol``.
SslCaFlag = Annotated[
    Path | None,
    typer.Option(
        "--ssl-ca",
        help=f"{_SSL_CA} and for gRPC (--protocol grpc: any --ssl-* flag turns TLS on).",
        rich_help_panel=SECURED,
    ),
]
#: ``--ssl-ca FILE`` of ``perfsweep ui``, whose gRPC users are picked in the dashboard.
SslCaUiFlag = Annotated[
    Path | None,
    typer.Option(
        "--ssl-ca",
        help=f"{_SSL_CA} and for the dashboard's gRPC users (any --ssl-* flag turns TLS on).",
        rich_help_panel=SECURED,
    ),
]
#: ``--ssl-ca FILE`` of a command that speaks HTTP only (``perfsweep predict``).
SslCaHttpFlag = Annotated[
    Path | None, typer.Option("--ssl-ca", help=f"{_SSL_CA}.", rich_help_panel=SECURED)
]
#: ``--ssl-cert FILE``.
SslCertFlag = Annotated[
    Path | None,
    typer.Option(
        "--ssl-cert", help="Client certificate (PEM) for mutual TLS.", rich_help_panel=SECURED
    ),
]
#: ``--ssl-key FILE``.
SslKeyFlag = Annotated[
    Path | None,
    typer.Option(
        "--ssl-key",
        help="The client certificate's key (PEM; default: in --ssl-cert).",
        rich_help_panel=SECURED,
    ),
]
#: ``--ssl-insecure``.
SslInsecureFlag = Annotated[
    bool,
    typer.Option(
        "--ssl-insecure",
        help="Do not verify the server's certificate (self-signed test servers; warned): "
        "https:// only, gRPC always checks it.",
        rich_help_panel=SECURED,
    ),
]
#: ``--header 'Name: value'``.
HeaderFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--header",
        "-H",
        metavar="<'Name: value'>",
        help="Sent with every request to the server (inference, statistics, metrics, "
        "repository; as metadata over gRPC); ${VAR} in the value reads the environment. "
        "Repeatable. Never written down (records, results, reports).",
        rich_help_panel=SECURED,
    ),
]
#: ``--header-file FILE``.
HeaderFileFlag = Annotated[
    list[Path] | None,
    typer.Option(
        "--header-file",
        metavar="<FILE>",
        help="A file of 'Name: value' lines, sent as --header (keeps tokens off the command line).",
        rich_help_panel=SECURED,
    ),
]
