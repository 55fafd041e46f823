"""What the load engine is told (:class:`EngineOptions`), and the one factory that derives it
from a scenario (:func:`engine_options`). Pure: no locust or gevent import, so the sweep and the
gate build options before (and without) patching the process.

``perfsweep load`` builds its options here too, from a scenario made of its flags, so the
traffic ``run``, ``gate`` and ``load`` describe is described once (``[input]``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from analyzer.config.access import PLAIN, ServerAccess
from analyzer.config.sections import STREAM_PROTOCOLS
from analyzer.config.urls import host_port, is_tls
from analyzer.errors import InputError
from analyzer.load.classes import RequestClass, mix_models, request_classes
from analyzer.load.inputs import DataMode, InputOptions, ShapeChoice
from analyzer.measure.lengths import Lengths
from analyzer.measure.measurement import WindowStats
from analyzer.measure.specs import Goals, LoadSpec

if TYPE_CHECKING:
    from analyzer.config.scenario import Scenario
    from analyzer.config.sections import InputSection

#: How often (seconds) the controller collects recorder deltas.
TICK_S = 0.1


@dataclass(frozen=True)
class EngineOptions:
    """Where to send load and how to generate it."""

    url: str
    model: str
    protocol: str = "http"
    #: Generator processes: 1 = in this process; N > 1 = N local worker processes.
    workers: int = 1
    #: ``traffic.workers = "auto"``: the most local processes to grow to while the generator's
    #: self-check finds it saturated (a saturated level is measured again with twice as many);
    #: 0 = ``workers`` stays as it is.
    max_workers: int = 0
    #: Run as a distributed master expecting this many remote workers (instead of spawning).
    expect_remote_workers: int = 0
    master_bind_host: str = "127.0.0.1"
    master_port: int = 0
    #: What each request carries.
    inputs: InputOptions = field(default_factory=InputOptions)
    #: HTTP hot path: "raw" (pre-built requests on pooled sockets, the default) or
    #: "geventhttpclient" (its pool; for A/B comparisons).
    http_client: str = "raw"
    #: Open loop: wake the dispatcher on a timerfd (sub-ms) instead of gevent's ms timers.
    precise_timer: bool = True
    #: A priority mix (``[[traffic.classes]]``): each request is drawn into a class by share and
    #: sent with its priority and timeout; results split by class. Empty: no mix.
    classes: tuple[RequestClass, ...] = ()
    #: A sequence-batched model (found in its config): mean requests per sequence.
    sequence_length: int = 20
    #: A sequence model: each sequence's length varies uniformly within this many percent.
    sequence_length_variation_pct: float = 20.0
    #: A sequence model in open loop: live sequences per generator process (closed loop: one
    #: per user).
    sequences: int = 4
    #: Where request tensors travel: "none" (in each request) or "system" (written once per
    #: generator process into a registered system shared-memory region that requests name,
    #: perf_analyzer's ``--shared-memory system``; the server must run on this host).
    shared_memory: str = "none"
    #: Open loop: in-flight requests per generator process before new ones wait in a backlog.
    pool_size: int = 512
    #: Prometheus endpoint of the target (None: try ``http://<url>/metrics`` for HTTP targets).
    metrics_url: str | None = None
    #: HTTP host:port for the statistics extension when ``protocol`` is grpc (None: use gRPC).
    stats_url: str | None = None
    #: TLS files and headers of every request (inference, statistics, metrics).
    access: ServerAccess = PLAIN
    #: The HTTP side (``url`` over HTTP, ``stats_url``) speaks TLS: the target's URL is https://.
    http_tls: bool = False
    scrape_server: bool = True
    #: A pipeline's composing models, or a mix's models: their statistics are read with the
    #: model's, per window (``ServerView.stages``).
    stage_models: tuple[str, ...] = ()
    #: Validity limits: above these the generator, not the server, decided the numbers.
    max_send_lag_ms: float = 10.0
    max_cpu_pct: float = 90.0
    #: Open loop: offered rate below this fraction of the target makes a result invalid.
    min_offered_ratio: float = 0.95
    tick_s: float = TICK_S
    #: A generative model: the streaming protocol (``grpc-stream``, ``generate-stream``,
    #: ``openai``, ``openai-chat``; ``protocol`` is then the transport its statistics use) and
    #: the requests' lengths. "": requests answered once.
    stream: str = ""
    lengths: Lengths = field(default_factory=Lengths)
    #: What goodput counts (requests meeting every goal); None: no goodput. A capacity step's
    #: own goals take its place.
    goals: Goals | None = None
    #: Called after each window (live view); must not block.
    on_window: Callable[[LoadSpec, WindowStats], None] | None = field(default=None, compare=False)

    @property
    def http_address(self) -> str | None:
        """The server's HTTP ``host:port`` (its health check, its statistics); None when the
        load speaks gRPC to an address with no HTTP side known, or OpenAI's protocol (no
        Triton health check to ask)."""
        if self.stream.startswith("openai"):
            return None
        return self.url if self.protocol == "http" else self.stats_url

    def http_base(self, address: str) -> str:
        """``address`` (``host:port`` of the HTTP side) as a URL with this target's scheme."""
        if "://" in address:
            return address
        return f"{'https' if self.http_tls else 'http'}://{address}"


def engine_options(
    scenario: Scenario,
    url: str,
    model: str,
    *,
    metrics_url: str | None = None,
    grpc_url: str | None = None,
    distributed: bool = False,
    **fields: Any,
) -> EngineOptions:
    """Options to load ``model`` at ``url`` (``http://host:port`` or ``host:port``) with the
    scenario's inputs, over the scenario's ``model.protocol``.

    Args:
        scenario: Where the inputs (the whole ``[input]`` section), the priority mix
            (``traffic.classes``), the sequence streams of a stateful model
            (``traffic.sequence_length``, ``sequence_length_variation_pct``, ``sequences``) and, when ``distributed``, the generator processes
            (``traffic.workers``, ``expect_workers``, ``master_bind_host``, ``master_port``)
            come from.
        url: The target's HTTP address (a ``Target.url``).
        model: The model to load.
        metrics_url: The target's Prometheus ``/metrics`` (GPU figures per window); None lets
            the engine try ``<url>/metrics``.
        grpc_url: The target's gRPC ``host:port`` when ``model.protocol`` is grpc (a managed
            server's ``grpc_url``); None: the HTTP port + 1, Triton's default layout. The
            server's statistics are still read over HTTP at ``url``.
        distributed: Use the scenario's ``[traffic]`` generator processes (``workers``, ``"auto"``
            included, and remote ones); without it the load comes from this process.
        **fields: Any other :class:`EngineOptions` field (``max_send_lag_ms``, ``on_window``...).
    """
    http_address = host_port(url)
    classes = request_classes(scenario.traffic)
    models = mix_models(classes, model)
    # A token stream: grpc-stream speaks gRPC (its statistics over HTTP), the others HTTP.
    stream = scenario.model.protocol if scenario.model.protocol in STREAM_PROTOCOLS else ""
    protocol = "grpc" if stream == "grpc-stream" else "http" if stream else scenario.model.protocol
    grpc = protocol == "grpc"
    grpc_url = grpc_url or scenario.model.grpc_url
    generative: dict[str, Any] = (
        {
            "stream": stream,
            "lengths": scenario.traffic.lengths(),
            # An OpenAI-compatible server has no Triton statistics to read.
            "scrape_server": not stream.startswith("openai"),
        }
        if stream
        else {}
    )
    options = EngineOptions(
        url=(host_port(grpc_url) if grpc_url else next_port(http_address))
        if grpc
        else http_address,
        model=model,
        protocol=protocol,
        stats_url=http_address if grpc else None,
        metrics_url=metrics_url,
        access=scenario.model.access(),
        http_tls=is_tls(url),
        classes=classes,
        # A mix of models: every model's statistics, per window.
        stage_models=models if len(models) > 1 else (),
        sequence_length=scenario.traffic.sequence_length,
        sequence_length_variation_pct=scenario.traffic.sequence_length_variation_pct,
        sequences=scenario.traffic.sequences,
        **input_fields(scenario.input),
        **generative,
    )
    if distributed:
        t = scenario.traffic
        auto = t.workers == "auto"
        options = replace(
            options,
            workers=1 if auto else int(t.workers),
            max_workers=usable_cores() if auto else 0,
            expect_remote_workers=t.expect_workers,
            master_bind_host=t.master_bind_host,
            # Local workers (no remote ones) take a free port; remote ones must know it.
            master_port=t.master_port if t.expect_workers else 0,
        )
    return replace(options, **fields)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def input_fields(section: InputSection) -> dict[str, Any]:
    """The request data of a scenario's ``[input]`` as :class:`EngineOptions` and the generator's
    ``EngineConfig`` take it: the one :class:`InputOptions` (checked on the way) and where the
    tensors travel."""
    return {"inputs": input_options(section), "shared_memory": section.shared_memory}


def next_port(address: str) -> str:
    """``host:port`` -> ``host:port+1`` (Triton's gRPC port beside its HTTP port)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"expected HOST:PORT for the target, got {address!r}")
    return f"{host}:{int(port) + 1}"


def input_options(section: InputSection, seed: int = 0) -> InputOptions:
    """The generator's ``InputOptions`` for a scenario's ``[input]`` (``seed``: the load's);
    raises ``InputError`` on a combination the generator refuses."""
    return InputOptions(
        mode=DataMode(section.mode),
        batch_size=section.batch_size,
        shapes={k: list(v) for k, v in section.shapes.items()} if section.shapes else None,
        data_file=section.data_file,
        unique_payloads=section.unique_payloads,
        repeat_ratio=section.repeat_ratio,
        distribution=tuple(ShapeChoice.of(d.shapes, d.weight) for d in section.distribution),
        seed=seed,
        pad_buckets=section.pad_buckets,
        pad_values=section.pad_values,
    )
