"""Locust users for Triton: a closed-loop user and an open-loop dispatcher, plus per-process context.

Every generator process (the in-process runner, or each ``analyzer.load.worker``) holds one
``ProcessContext`` on its Locust ``Environment``: the current ``EngineConfig`` (sent by the
controller before each load level), the ``InputSet`` built from it, the requests built from
that once for the whole process (``PreparedRequests``: every user's client shares them), the
``Recorder``, and the seeded draw of each request's traffic class (``ClassDraw``; always class 0
without a priority mix).

* ``ClosedLoopUser``: one request outstanding per user, back to back (perf_analyzer
  ``--concurrency-range``). Latency is timed from the actual send (closed loop; a stall delays the
  next send and hides in the tail: coordinated omission).
* ``OpenLoopUser``: a scheduler computes intended send times (the level's arrival process,
  seeded: :mod:`analyzer.measure.arrivals`; the dispatchers of all processes share one stream
  and each sends every n-th request of it) at ``rate_per_user`` and hands each request to its
  own greenlet from a bounded pool. When the pool is full the request waits in a backlog (never
  dropped): its latency, timed from the intended send time, keeps growing, exactly as a real
  client's would.

A sequence-batched model (``sequence_batching`` in its config) gets correlated streams
(:mod:`analyzer.load.sequences`, perf_analyzer's ``--sequence-length`` semantics), every request
carrying its ``sequence_id``/``sequence_start``/``sequence_end`` and one request of a sequence in
flight at a time: each closed-loop user owns one sequence at a time; an open-loop process holds
``EngineConfig.sequences`` live sequences, and a send that finds none idle waits in the backlog
(its wait counted from the intended send time, as perf_analyzer counts it). Correlation ids are
distinct across users, processes and levels (:func:`~analyzer.load.sequences.stream_first_id`).
"""

from __future__ import annotations

import analyzer.load._gevent  # noqa: F401  (isort: skip) patch first
import atexit
import collections
import itertools
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import gevent
from gevent.pool import Pool
from locust import User, constant, task
from locust.env import Environment

from analyzer.config.access import PLAIN, ServerAccess
from analyzer.errors import InputError
from analyzer.load.classes import ClassDraw, RequestClass
from analyzer.load.clients import fetch_model_documents, make_client
from analyzer.load.inputs import DataMode, InputOptions, InputSet, build_inputs
from analyzer.load.prepared import (
    InferClient,
    InferError,
    PreparedRequests,
    _close_grpc,
    prepare_requests,
)
from analyzer.load.recorder import Recorder
from analyzer.load.sequences import (
    IDS_PER_STREAM,
    SequenceStep,
    SequenceStreams,
    is_sequence_model,
    stream_first_id,
)
from analyzer.load.shm import ShmInputs
from analyzer.load.timing import DeadlineSleeper
from analyzer.measure.arrivals import POISSON, ArrivalProcess
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
        self._users_started = 0
        self._next_payload = 0

    def configure(self, config: EngineConfig) -> None:
        """Adopt a new level's config; rebuild inputs and requests only when they change;
        reset recording."""
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
        requests_key = (key, config.http_client, classes, config.shared_memory, config.access)
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
        self.config = config
        self.classes = classes
        # The next request's class: seeded per level and per process, so processes do not
        # draw their classes in lock-step.
        self.next_class = ClassDraw(classes, config.seed * 1_000_003 + 7919 * self.process_index)
        self.recorder = Recorder(len(classes))
        self._users_started = 0
        # A level's open-loop sequences are made by its first dispatcher (OpenLoopUser.start_with).
        self.open_streams = None

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
            headers=config.access.http_headers(),
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
        self._inputs_key = self._requests_key = None

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
    if ctx is None or ctx.config is None or ctx.inputs is None:
        raise RuntimeError("perfsweep users started before the engine was configured")
    assert isinstance(ctx, ProcessContext)
    return ctx


def _kind(error: BaseException | None) -> BaseException | str | None:
    """What the recorder files an error under: the server's status and message for failed
    inferences ("HTTP 503: ..."), the exception class and message for anything else."""
    return str(error) if isinstance(error, InferError) else error


def _send_whole(
    client: InferClient,
    payload: int,
    klass: int,
    step: SequenceStep | None,
    streams: SequenceStreams | None,
    pending: set[gevent.Greenlet],
) -> None:
    """``client.infer``; a sequence step runs in a greenlet of its own (in ``pending`` until it
    ends), which hands the step back to ``streams``, so that a user killed at a level's end
    leaves the request to finish rather than cutting it off.

    A cut-off request is cancelled by the server, and a sequence whose request vanished that
    way can keep its batcher slot (the reference server's oldest strategy waits for it to
    execute): the next level's sequences would find no slot.
    """
    if step is None or streams is None:
        client.infer(payload, klass)
        return

    def whole() -> None:
        ok = False
        try:
            client.infer(payload, klass, step)
            ok = True
        finally:
            streams.done(step, ok=ok)

    greenlet = gevent.spawn(whole)
    pending.add(greenlet)
    greenlet.link(pending.discard)
    greenlet.get()


def _end_sequences(
    client: InferClient,
    streams: SequenceStreams,
    pending: set[gevent.Greenlet],
    next_payload: Any,
) -> None:
    """At a level's end: let the requests in flight finish, end every live sequence with one
    more request (not recorded; the server frees their slots now instead of after its idle
    timeout, which would hold the next level's sequences back), then close the client."""
    try:
        gevent.joinall(list(pending), timeout=30.0)
        for step in streams.closing():
            ok = False
            try:
                client.infer(next_payload(), 0, step)
                ok = True
            except Exception:  # best effort: the idle timeout frees it anyway
                pass
            finally:
                streams.done(step, ok=ok)
    finally:
        client.close()


def _fire(env: Environment, name: str, seconds: float, error: BaseException | None) -> None:
    # Locust's own (rounded) stats only feed its UI; perfsweep's numbers come from the Recorder.
    env.events.request.fire(
        request_type="infer",
        name=name,
        response_time=seconds * 1000.0,
        response_length=0,
        exception=error,
        context={},
    )


class ClosedLoopUser(User):
    """One request outstanding, back to back: concurrency = number of users."""

    wait_time = constant(0)

    def on_start(self) -> None:
        """Connect (after any fork: clients are never created at import)."""
        self.start_with(context_of(self.environment))

    def start_with(self, ctx: ProcessContext) -> None:
        """Set the user up on ``ctx`` (the dashboard's users pass a context of their own)."""
        assert ctx.config is not None and ctx.inputs is not None
        self.ctx = ctx
        self.infer_client: InferClient = make_client(
            ctx.config.protocol,
            ctx.config.url,
            ctx.inputs,
            1,
            ctx.config.http_client,
            prepared=ctx.requests,
            classes=ctx.classes,
            sequence=ctx.sequence_model,
            access=ctx.config.access,
            tls=ctx.config.http_tls,
        )
        #: A sequence model: this user's sequence (one at a time, one request in flight).
        self.streams = ctx.new_streams(1) if ctx.sequence_model else None
        self.pending: set[gevent.Greenlet] = set()

    @task
    def infer(self) -> None:
        """Send one request and record it."""
        recorder = self.ctx.recorder
        recorder.dispatched_one(0.0)
        payload = self.ctx.next_payload()
        klass = self.ctx.next_class()
        step = self.streams.next() if self.streams is not None else None
        error: BaseException | None = None
        start = time.perf_counter()
        try:
            _send_whole(self.infer_client, payload, klass, step, self.streams, self.pending)
        except Exception as exc:  # any failure is a failed request, recorded by kind
            error = exc
        end = time.perf_counter()
        recorder.done(end - start, end - start, _kind(error), klass)
        _fire(
            self.environment, self.ctx.inputs.model if self.ctx.inputs else "", end - start, error
        )
        if error is not None and isinstance(error, OSError):
            gevent.sleep(0.01)  # a refused connection must not become a CPU-burning spin

    def on_stop(self) -> None:
        """Close connections (a sequence model's after ending its sequence)."""
        client = getattr(self, "infer_client", None)
        streams = getattr(self, "streams", None)
        if client is not None and streams is not None:
            gevent.spawn(_end_sequences, client, streams, self.pending, self.ctx.next_payload)
        elif client is not None:
            client.close()


class OpenLoopUser(User):
    """A dispatcher: requests at ``rate_per_user`` on a schedule, independent of responses."""

    wait_time = constant(0)

    def on_start(self) -> None:
        """Create the pool and the client (one connection per pool slot, HTTP)."""
        self.start_with(context_of(self.environment))

    def start_with(self, ctx: ProcessContext, config: EngineConfig | None = None) -> None:
        """Set the dispatcher up on ``ctx``, with ``config`` in place of the context's own (the
        dashboard's users take the rate and arrival process from Locust's form)."""
        assert ctx.config is not None and ctx.inputs is not None
        self.ctx = ctx
        self.config = config or ctx.config
        self.pool = Pool(self.config.pool_size)
        #: Sends waiting for a free slot: (intended time, place in the stream).
        self.backlog: collections.deque[tuple[float, int]] = collections.deque()
        self.infer_client: InferClient = make_client(
            self.config.protocol,
            self.config.url,
            ctx.inputs,
            self.config.pool_size,
            self.config.http_client,
            prepared=ctx.requests,
            classes=ctx.classes,
            sequence=ctx.sequence_model,
            access=self.config.access,
            tls=self.config.http_tls,
        )
        if ctx.sequence_model and ctx.open_streams is None:
            # The level's first dispatcher makes the process's streams (the others share them).
            ctx.open_streams = ctx.new_streams(self.config.sequences)
        #: A sequence model: the process's live sequences (shared by its dispatchers).
        self.streams = ctx.open_streams
        self.pending: set[gevent.Greenlet] = set()
        index = ctx.next_user_index()
        self.rng = random.Random(self.config.seed * 1_000_003 + index)

    def _send_times(self) -> Iterator[tuple[int, float]]:
        """This dispatcher's sends: each one's place in its stream and its intended time,
        seconds from the dispatcher's start."""
        c = self.config
        if c.shared_stream:
            # Every dispatcher walks the level's one stream and keeps its own share.
            rate = c.rate_per_user * c.shared_stream
            slot = self.ctx.process_index % c.shared_stream
            return c.arrival.indexed_send_times(rate, c.seed, slot, c.shared_stream)
        # A stream of its own, started at a random phase so that dispatchers do not fire in
        # lock-step.
        phase = self.rng.uniform(0, 1.0 / c.rate_per_user)
        seed = self.rng.getrandbits(32)
        return ((i, phase + t) for i, t in c.arrival.indexed_send_times(c.rate_per_user, seed))

    def _payload(self, send: int) -> int:
        """The payload of the stream's ``send``-th send: a replayed trace's own, where it
        recorded them, else the process's next in rotation."""
        trace = self.config.arrival.trace
        recorded = trace.payload(send) if trace is not None else None
        return self.ctx.next_payload() if recorded is None else recorded

    @task
    def dispatch(self) -> None:
        """Run the schedule until the runner stops this user."""
        recorder = self.ctx.recorder
        # Every microsecond the dispatcher wakes late is added to the latency (timed from the
        # intended send), so it sleeps on a timerfd, not on gevent's millisecond timers.
        sleeper = DeadlineSleeper(use_timerfd=self.config.precise_timer)
        sends = self._send_times()
        start = time.perf_counter()
        if self.config.shared_stream and self.config.stream_epoch:
            # The stream runs from the level's epoch in every process (wall clock, converted
            # to this process's perf_counter); a process that starts late joins it at the
            # first send still ahead rather than sending what it missed at once.
            start += self.config.stream_epoch - time.time()
            sends = itertools.dropwhile(lambda s: start + s[1] < time.perf_counter(), sends)
        send, at = next(sends)
        intended = start + at
        try:
            while True:
                now = time.perf_counter()
                self._resume_backlog()
                # After each wake-up send everything overdue (a busy hub wakes us late).
                while intended <= now:
                    recorder.dispatched_one(now - intended, time.time())
                    step: SequenceStep | None = None
                    # Waiting sends go first (a sequence freed by a completion is theirs).
                    ready = self.pool.free_count() > 0 and not self.backlog
                    if ready and self.streams is not None:
                        step = self.streams.next()
                        ready = step is not None
                    if ready:
                        self.pool.spawn(self._send, (intended, send), step)
                    else:
                        # Waits for a free slot or, for a sequence model, an idle sequence:
                        # every completion takes the oldest waiting send.
                        self.backlog.append((intended, send))
                        recorder.backlog(len(self.backlog))
                    send, at = next(sends)
                    intended = start + at
                sleeper.sleep_until(intended)
        finally:
            sleeper.close()

    def _resume_backlog(self) -> None:
        """Give waiting sends to free slots that no sender took them to.

        A sender returns when it finds the backlog empty, but the pool frees its slot only a
        moment later (when the hub runs the greenlet's exit callbacks): a send the dispatcher
        queued in between found no free slot, and every later one queues behind it, so with
        one slot the load stopped for good (a level with a full pool completed nothing).
        """
        while self.backlog and self.pool.free_count() > 0:
            step: SequenceStep | None = None
            if self.streams is not None:
                step = self.streams.next()
                if step is None:  # every sequence busy: a completion frees one
                    return
            self.pool.spawn(self._send, self.backlog.popleft(), step)

    def _send(self, due: tuple[float, int], step: SequenceStep | None) -> None:
        recorder = self.ctx.recorder
        model = self.ctx.inputs.model if self.ctx.inputs else ""
        streams = self.streams
        while True:
            intended, send = due
            payload = self._payload(send)
            klass = self.ctx.next_class()
            error: BaseException | None = None
            start = time.perf_counter()
            try:
                _send_whole(self.infer_client, payload, klass, step, streams, self.pending)
            except Exception as exc:  # any failure is a failed request, recorded by kind
                error = exc
            end = time.perf_counter()
            recorder.done(end - intended, end - start, _kind(error), klass)
            _fire(self.environment, model, end - intended, error)
            if not self.backlog:
                return
            due = self.backlog.popleft()
            if streams is not None:
                # The sequence just done is idle (the dispatcher defers to the backlog).
                step = streams.next()
                if step is None:  # not expected; the next completion takes it
                    self.backlog.appendleft(due)
                    return

    def on_stop(self) -> None:
        """Kill in-flight request greenlets (Locust does not kill greenlets a user spawned)."""
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.kill(block=False)
        client = getattr(self, "infer_client", None)
        streams = getattr(self, "streams", None)
        if client is not None and streams is not None:
            gevent.spawn(_end_sequences, client, streams, self.pending, self.ctx.next_payload)
        elif client is not None:
            client.close()


USER_CLASSES: list[type[User]] = [ClosedLoopUser, OpenLoopUser]
