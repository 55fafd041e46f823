"""What each generator process holds for a load level: :class:`EngineConfig` (the level's plain
values, sent by the controller before each level) and :class:`ProcessContext` (the ``InputSet``
built from it, the requests built once for the whole process, the ``Recorder``, the seeded
draw of each request's traffic class, shared-memory regions and sequence streams), attached to
the process's Locust ``Environment``.
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
import atexit
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from locust.env import Environment

from analyzer.config.access import PLAIN, ServerAccess
from analyzer.errors import InputError
from analyzer.load.classes import (
    ClassDraw,
    RequestClass,
    RoutedClient,
    class_models,
    mix_models,
)
from analyzer.load.clients import fetch_model_documents, make_client
from analyzer.load.inputs import DataMode, InputOptions, InputSet, build_inputs
from analyzer.load.prepared import (
    InferClient,
    PreparedRequests,
    _close_grpc,
    prepare_requests,
)
from analyzer.load.recorder import Recorder
from analyzer.load.sequences import (
    IDS_PER_STREAM,
    SequenceStreams,
    is_sequence_model,
    stream_first_id,
)
from analyzer.load.shm import ShmInputs
from analyzer.load.streams import StreamClient, check_streaming_model, make_stream_client
from analyzer.measure.arrivals import POISSON, ArrivalProcess
from analyzer.measure.lengths import GenRequest, Lengths
from analyzer.measure.specs import LoadMode

_CONTEXT_ATTR = "perfsweep_context"
#: ``EngineConfig.shared_memory`` values.
SHARED_MEMORY = ("none", "system")


@dataclass(frozen=True)
class EngineConfig:
    """What every generator process needs for one load level (plain values: it crosses processes)."""

    protocol: str
    url: str
    model: str
    mode: LoadMode
    #: Open loop: requests/second each dispatcher user offers.
    rate_per_user: float = 0.0
    arrival: ArrivalProcess = POISSON
    #: Open loop: the dispatchers (one per generator process) that share one stream of
    #: ``arrival`` (each sends every n-th request of it, so bursts stay bursts); 0: each
    #: dispatcher draws a stream of its own (the dashboard's users).
    shared_stream: int = 0
    #: With ``shared_stream``: when the stream starts (wall clock, ``time.time()``), the same in
    #: every process so that their shares interleave as the stream does; 0: at each start.
    stream_epoch: float = 0.0
    seed: int = 0
    #: Open loop: requests in flight per dispatcher user before later ones wait in the backlog.
    pool_size: int = 512
    #: What each request carries (its ``seed`` is replaced by the level's: :meth:`input_options`).
    inputs: InputOptions = field(default_factory=InputOptions)
    #: HTTP hot path: "raw" (pre-built requests on pooled sockets) or "geventhttpclient".
    http_client: str = "raw"
    #: Open loop: wake the dispatcher on a timerfd (sub-ms) rather than ``gevent.sleep`` (~1 ms).
    precise_timer: bool = True
    #: Priority mix: ``[RequestClass.to_dict(), ...]`` (None: no mix).
    classes: list[dict[str, Any]] | None = None
    #: A sequence model: mean requests per sequence, their variation (percent), and the live
    #: sequences of an open-loop process.
    sequence_length: int = 20
    sequence_length_variation_pct: float = 20.0
    sequences: int = 4
    #: "none" or "system": the inputs in one registered shared-memory region per process.
    shared_memory: str = "none"
    #: TLS files and headers of every request (sent to the processes, never written down).
    access: ServerAccess = PLAIN
    #: HTTP over TLS (the target's URL is ``https://``).
    http_tls: bool = False
    #: A generative model's streaming protocol (``analyzer.load.streams.STREAM_PROTOCOLS``);
    #: "": requests answered once, with tensors from ``inputs``.
    stream: str = ""
    #: A generative load: the requests' lengths (:meth:`Lengths.to_dict`).
    lengths: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain values (msgpack/JSON): enums as their values, the inputs as
        :meth:`InputOptions.to_dict`."""
        plain = {f.name: getattr(self, f.name) for f in fields(self)}
        plain.update(mode=self.mode.value, arrival=self.arrival.to_dict())
        plain["inputs"] = self.inputs.to_dict()
        plain["access"] = self.access.to_wire()
        return plain

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineConfig:
        """Inverse of ``to_dict`` (``inputs`` may be left out: random data)."""
        values = dict(data)
        values["mode"] = LoadMode(values["mode"])
        values["arrival"] = ArrivalProcess.from_dict(values.get("arrival", "poisson"))
        values["inputs"] = InputOptions.from_dict(values.get("inputs") or {})
        values["access"] = ServerAccess.from_wire(values.get("access"))
        return cls(**values)

    def request_classes(self) -> tuple[RequestClass, ...]:
        """The traffic classes of this level (empty without a priority mix)."""
        return tuple(RequestClass.from_dict(c) for c in self.classes or ())

    def input_options(self) -> InputOptions:
        """How this level's payloads are built: :attr:`inputs` with the level's seed."""
        return replace(self.inputs, seed=self.seed)


@dataclass(frozen=True)
class Lane:
    """Another model of a mix of models: its request data and the requests built from it, once
    per process (the load's own model is the context's ``inputs`` and ``requests``)."""

    inputs: InputSet
    requests: PreparedRequests


class ProcessContext:
    """Per-process engine state, attached to the Locust environment."""

    def __init__(self, process_index: int = 0) -> None:
        self.process_index = process_index
        self.config: EngineConfig | None = None
        self.inputs: InputSet | None = None
        #: The requests of ``inputs``, built once per process (not per user).
        self.requests: PreparedRequests | None = None
        self.recorder = Recorder()
        self.classes: tuple[RequestClass, ...] = ()
        self.next_class = ClassDraw((), 0)
        #: A mix of models: the other models' lanes, by name (empty: one model).
        self.lanes: dict[str, Lane] = {}
        #: The model of each traffic class, by class index.
        self.class_models: tuple[str, ...] = ()
        #: The model is sequence-batched: every request carries its sequence's parameters.
        self.sequence_model = False
        #: Open loop, a sequence model: the process's live sequences, made by the level's first
        #: dispatcher (None until then, and otherwise).
        self.open_streams: SequenceStreams | None = None
        self._streams_made = 0
        #: ``shared_memory = "system"``: this process's region of ``inputs`` (and its client).
        self.shm: ShmInputs | None = None
        self._shm_client: Any = None
        atexit.register(self.close)
        self._inputs_key: tuple | None = None
        self._requests_key: tuple | None = None
        self._lanes_key: tuple | None = None
        self._users_started = 0
        self._next_payload = 0
        #: A generative level (``EngineConfig.stream``): the requests' lengths, drawn once.
        self.generative = False
        self.gen_requests: list[GenRequest] = []
        #: The level's dispatchers send (False once the controller ends a generative level:
        #: they stop sending and leave the streams in flight running, :meth:`stop_sending`).
        self.sending = True

    def configure(self, config: EngineConfig) -> None:
        """Adopt a new level's config; rebuild inputs and requests only when they change;
        reset recording."""
        self.sending = True
        if config.stream:
            self._configure_stream(config)
            return
        self.generative = False
        options = config.input_options()
        if options.mode is DataMode.RANDOM and self.process_index:
            # Each process draws payloads of its own: with the same seed every worker would send
            # the same ones, and the combined traffic would repeat more than ``repeat_ratio``.
            options = replace(options, seed=options.seed + 1_000_003 * self.process_index)
        key = (
            config.protocol,
            config.url,
            config.model,
            repr(options.to_dict()),
            config.shared_memory,
        )
        if key != self._inputs_key:
            metadata, model_config = fetch_model_documents(
                config.protocol, config.url, config.model, config.access, config.http_tls
            )
            sequence_model = is_sequence_model(model_config)
            if sequence_model and options.batch_size > 1:
                raise InputError(
                    f"model {config.model!r} is sequence-batched: each request is one step of "
                    f"one sequence, so the batch size must be 1, not {options.batch_size} (the "
                    "server batches sequences itself); drop [input] batch_size / --batch-size"
                )
            self.inputs = build_inputs(metadata, model_config, options=options)
            self.sequence_model = sequence_model
            self._close_shm()
            if config.shared_memory == "system":
                self.shm = self._open_shm(config, self.inputs)
            self._inputs_key = key
            self._requests_key = None
            self._next_payload = 0
        _check_trace_payloads(config, self.inputs)
        classes = config.request_classes()
        # A class's share is how often it is drawn, not what its requests carry: a level whose
        # shares differ (classes at rates of their own) keeps the requests built.
        carried = tuple(replace(c, share=0.0) for c in classes)
        requests_key = (key, config.http_client, carried, config.shared_memory, config.access)
        if config.shared_memory not in SHARED_MEMORY:
            raise InputError(
                f"shared memory must be one of {SHARED_MEMORY}, not {config.shared_memory!r}"
            )
        if requests_key != self._requests_key:
            assert self.inputs is not None
            self.requests = prepare_requests(
                config.protocol,
                config.url,
                self.inputs,
                config.http_client,
                classes,
                sequence=self.sequence_model,
                shm=self.shm,
                headers=config.access.http_headers(),
            )
            self._requests_key = requests_key
        models = mix_models(classes, config.model)
        if (requests_key, models) != self._lanes_key:
            self.lanes = {m: self._lane(config, m, options, classes) for m in models[1:]}
            self._lanes_key = (requests_key, models)
        self.config = config
        self.classes = classes
        self.class_models = class_models(classes, config.model)
        # The next request's class: seeded per level and per process, so processes do not
        # draw their classes in lock-step.
        self.next_class = ClassDraw(classes, config.seed * 1_000_003 + 7919 * self.process_index)
        self.recorder = Recorder(len(classes))
        self._users_started = 0
        # A level's open-loop sequences are made by its first dispatcher (OpenLoopUser.start_with).
        self.open_streams = None

    def _configure_stream(self, config: EngineConfig) -> None:
        """A generative level: check the model streams (a Triton model must be decoupled),
        draw the requests' lengths once per load (seeded)."""
        key = (config.stream, config.url, config.model, repr(config.lengths), config.seed)
        if key != self._inputs_key:
            if config.stream in ("grpc-stream", "generate-stream"):
                _, model_config = fetch_model_documents(
                    config.protocol, config.url, config.model, config.access, config.http_tls
                )
                check_streaming_model(model_config, config.model, config.stream)
            lengths = Lengths.from_dict(config.lengths or {})
            self.gen_requests = lengths.draw(config.seed)
            self._inputs_key = key
            self._requests_key = None
            self._next_payload = 0
        self.generative = True
        self.config = config
        self.classes = ()
        self.class_models = ()
        self.next_class = ClassDraw((), 0)
        self.recorder = Recorder()
        self._users_started = 0
        self.open_streams = None

    def stop_sending(self) -> None:
        """End the level's sending: the dispatchers send nothing more, and what they sent runs
        on until the controller stops the users (it collects the streams' first tokens)."""
        self.sending = False

    def stream_client(self, config: EngineConfig) -> StreamClient:
        """A user's streaming client for a generative level."""
        return make_stream_client(
            config.stream, config.url, config.model, config.access, config.http_tls
        )

    def gen_request(self, send: int) -> tuple[GenRequest, int]:
        """The ``send``-th generative request and its prompt's salt: a replayed trace's own
        lengths where it recorded them, else the load's drawn requests in rotation."""
        assert self.config is not None
        trace = self.config.arrival.trace
        recorded = trace.length(send) if trace is not None else None
        salt = self.config.seed * 1_000_003 + 7_919 * self.process_index + send
        if recorded is not None:
            return GenRequest(*recorded), salt
        return self.gen_requests[send % len(self.gen_requests)], salt

    def _lane(
        self,
        config: EngineConfig,
        model: str,
        options: InputOptions,
        classes: tuple[RequestClass, ...],
    ) -> Lane:
        """Model ``model`` of a mix: its inputs, built as the load's own model's are."""
        if self.sequence_model or config.shared_memory != "none":
            what = "a sequence-batched model" if self.sequence_model else "shared memory"
            raise InputError(
                f"a mix of models ({config.model!r}, {model!r}, ...) cannot use {what}: each "
                "model's requests are built from its own inputs and sent whole"
            )
        metadata, model_config = fetch_model_documents(
            config.protocol, config.url, model, config.access, config.http_tls
        )
        if is_sequence_model(model_config):
            raise InputError(
                f"model {model!r} of the mix is sequence-batched: a mix of models sends "
                "stateless requests; tune it on its own"
            )
        try:
            inputs = build_inputs(metadata, model_config, options=options)
        except InputError as exc:
            raise InputError(f"model {model!r} of the mix: {exc}") from exc
        _check_trace_payloads(config, inputs)
        requests = prepare_requests(
            config.protocol,
            config.url,
            inputs,
            config.http_client,
            classes,
            sequence=False,
            shm=None,
            headers=config.access.http_headers(),
        )
        return Lane(inputs, requests)

    def client(self, config: EngineConfig, concurrency: int) -> InferClient:
        """A user's client for ``config`` (the context's own, or the dashboard's form): the
        load's model's, or a mix's, whose requests go to their class's model."""
        assert self.inputs is not None

        def of(inputs: InputSet, requests: PreparedRequests | None) -> InferClient:
            return make_client(
                config.protocol,
                config.url,
                inputs,
                concurrency,
                config.http_client,
                prepared=requests,
                classes=self.classes,
                sequence=self.sequence_model,
                access=config.access,
                tls=config.http_tls,
            )

        own = of(self.inputs, self.requests)
        if not self.lanes:
            return own
        clients = {self.inputs.model: own}
        clients.update({m: of(lane.inputs, lane.requests) for m, lane in self.lanes.items()})
        return RoutedClient([clients[m] for m in self.class_models], list(clients.values()))

    def model_of(self, klass: int) -> str:
        """The model a request of class ``klass`` goes to."""
        if self.class_models:
            return self.class_models[klass]
        return self.inputs.model if self.inputs else ""

    def _open_shm(self, config: EngineConfig, inputs: InputSet) -> ShmInputs:
        """One registered region holding ``inputs``' distinct payloads (closed by :meth:`close`
        or when the inputs change)."""
        if config.protocol == "grpc":
            import tritonclient.grpc as grpcclient

            self._shm_client = grpcclient.InferenceServerClient(
                config.url, **config.access.grpc_options()
            )
        else:
            import tritonclient.http as httpclient

            tls = config.access.http_tls_options() if config.http_tls else {}
            self._shm_client = httpclient.InferenceServerClient(config.url, **tls)
        datatypes = {spec.name: spec.datatype for spec in inputs.specs}
        return ShmInputs(
            self._shm_client,
            inputs.payloads,
            datatypes=datatypes,
            name_prefix=f"perfsweep_{self.process_index}",
            headers=(
                config.access.grpc_metadata()
                if config.protocol == "grpc"
                else config.access.http_headers()
            ),
        )

    def _close_shm(self) -> None:
        shm, self.shm = self.shm, None
        client, self._shm_client = self._shm_client, None
        try:
            if shm is not None:
                shm.close()
        finally:
            if client is not None:
                if hasattr(client, "stop_stream"):  # gRPC: close the channel exactly once
                    _close_grpc(client)
                else:
                    client.close()

    def close(self) -> None:
        """Release what the process holds beyond a level: its shared-memory region (unregistered
        and unlinked). Idempotent; also runs at exit."""
        self._close_shm()
        self._inputs_key = self._requests_key = self._lanes_key = None

    def new_streams(self, sequences: int) -> SequenceStreams:
        """Sequence streams with ids of their own (a block no other stream of this load, in
        any process or level, uses), seeded per stream."""
        assert self.config is not None
        index = self._streams_made
        self._streams_made += 1
        return SequenceStreams(
            self.config.sequence_length,
            self.config.sequence_length_variation_pct,
            sequences,
            seed=self.config.seed * 1_000_003 + 7919 * self.process_index + index,
            first_id=stream_first_id(self.process_index, index),
            id_range=IDS_PER_STREAM,
        )

    def next_user_index(self) -> int:
        """A distinct index per user started in this process (seeds, phases)."""
        self._users_started += 1
        return self.process_index * 1000 + self._users_started

    def next_payload(self) -> int:
        """The rotation slot of the next request this process sends.

        One counter for all the process's users, kept across load levels (until the inputs
        change), so the process walks its rotation once in order: per-user counters sent each
        payload once per user, and a new level started the rotation over, which a response
        cache would have answered.
        """
        index = self._next_payload
        self._next_payload += 1
        return index


def _check_trace_payloads(config: EngineConfig, inputs: InputSet | None) -> None:
    """A replayed trace's payload indices must name entries of the request data.

    Raises:
        InputError: an index past the data's last entry.
    """
    trace = config.arrival.trace
    if trace is None or not trace.payloads or inputs is None:
        return
    held, top = len(inputs.payloads), max(trace.payloads)
    if top >= held:
        raise InputError(
            f"trace {trace.source}: a request sends payload {top}, but the request data holds "
            f"{held} (0-{held - 1}); give the data its payload column indexes (--input-data)"
        )


def attach_context(env: Environment, ctx: ProcessContext) -> None:
    """Make ``ctx`` the engine context of ``env``."""
    setattr(env, _CONTEXT_ATTR, ctx)


def context_of(env: Environment) -> ProcessContext:
    """The engine context of ``env`` (set by the runner or worker before users start)."""
    ctx = getattr(env, _CONTEXT_ATTR, None)
    if ctx is None or ctx.config is None or (ctx.inputs is None and not ctx.generative):
        raise RuntimeError("perfsweep users started before the engine was configured")
    assert isinstance(ctx, ProcessContext)
    return ctx
