"""Locust users for Triton: a closed-loop user and an open-loop dispatcher.

Every user reads its process's :class:`~analyzer.load.context.ProcessContext` (the level's
config, inputs, prepared requests, recorder and class draw) from its Locust ``Environment``.

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
import collections
import itertools
import random
import time
from collections.abc import Iterator
from typing import Any

import gevent
from gevent.pool import Pool
from locust import User, constant, task
from locust.env import Environment

from analyzer.load.context import EngineConfig, ProcessContext, context_of
from analyzer.load.prepared import (
    InferClient,
    InferError,
)
from analyzer.load.sequences import (
    SequenceStep,
    SequenceStreams,
)
from analyzer.load.streams import StreamClient
from analyzer.load.timing import DeadlineSleeper
from analyzer.measure.tokens import StreamRecord


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


def _stream_one(
    env: Environment, ctx: ProcessContext, client: StreamClient, send: int, intended: float
) -> None:
    """Send the ``send``-th generative request, time its tokens from ``intended`` (open loop:
    the schedule's time; closed loop: the actual send) and record it.

    Locust's own statistics see each request twice: ``stream`` (end to end, its tokens as the
    response length) and ``ttft`` (time to first token), so its dashboard shows both.
    """
    request, salt = ctx.gen_request(send)
    record = StreamRecord(intended, intended, request.input_tokens)
    ctx.recorder.stream_started(record)
    error: BaseException | None = None
    try:
        client.stream(request, salt, record)
    except Exception as exc:  # any failure is a failed request (its tokens kept)
        error = exc
        record.failed = True
    end = record.end or time.perf_counter()
    ctx.recorder.stream_done(record, end - intended, end - record.sent, _kind(error))
    name = ctx.config.model if ctx.config is not None else ""
    env.events.request.fire(
        request_type="stream",
        name=name,
        response_time=(end - intended) * 1000.0,
        response_length=record.output_tokens,
        exception=error,
        context={},
    )
    ttft = record.ttft_s
    if ttft is not None:
        env.events.request.fire(
            request_type="ttft",
            name=name,
            response_time=ttft * 1000.0,
            response_length=record.output_tokens,
            exception=None,
            context={},
        )
    if error is not None and isinstance(error, OSError):
        gevent.sleep(0.01)  # a refused connection must not become a CPU-burning spin


class ClosedLoopUser(User):
    """One request outstanding, back to back: concurrency = number of users."""

    wait_time = constant(0)

    def on_start(self) -> None:
        """Connect (after any fork: clients are never created at import)."""
        self.start_with(context_of(self.environment))

    def start_with(self, ctx: ProcessContext) -> None:
        """Set the user up on ``ctx`` (the dashboard's users pass a context of their own)."""
        assert ctx.config is not None
        self.ctx = ctx
        self.pending: set[gevent.Greenlet] = set()
        if ctx.generative:
            self.stream_client: StreamClient = ctx.stream_client(ctx.config)
            self.streams = None
            return
        assert ctx.inputs is not None
        self.infer_client: InferClient = ctx.client(ctx.config, 1)
        #: A sequence model: this user's sequence (one at a time, one request in flight).
        self.streams = ctx.new_streams(1) if ctx.sequence_model else None

    @task
    def infer(self) -> None:
        """Send one request and record it."""
        recorder = self.ctx.recorder
        recorder.dispatched_one(0.0)
        if self.ctx.generative:
            send = self.ctx.next_payload()
            _stream_one(self.environment, self.ctx, self.stream_client, send, time.perf_counter())
            return
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
        _fire(self.environment, self.ctx.model_of(klass), end - start, error)
        if error is not None and isinstance(error, OSError):
            gevent.sleep(0.01)  # a refused connection must not become a CPU-burning spin

    def on_stop(self) -> None:
        """Close connections (a sequence model's after ending its sequence)."""
        stream_client = getattr(self, "stream_client", None)
        if stream_client is not None:
            stream_client.close()
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
        assert ctx.config is not None
        self.ctx = ctx
        self.config = config or ctx.config
        self.pool = Pool(self.config.pool_size)
        #: Sends waiting for a free slot: (intended time, place in the stream).
        self.backlog: collections.deque[tuple[float, int]] = collections.deque()
        index = ctx.next_user_index()
        self.rng = random.Random(self.config.seed * 1_000_003 + index)
        self.pending: set[gevent.Greenlet] = set()
        if ctx.generative:
            self.stream_client: StreamClient = ctx.stream_client(self.config)
            self.streams = None
            return
        assert ctx.inputs is not None
        self.infer_client: InferClient = ctx.client(self.config, self.config.pool_size)
        if ctx.sequence_model and ctx.open_streams is None:
            # The level's first dispatcher makes the process's streams (the others share them).
            ctx.open_streams = ctx.new_streams(self.config.sequences)
        #: A sequence model: the process's live sequences (shared by its dispatchers).
        self.streams = ctx.open_streams

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
        """Run the schedule until the runner stops this user or ends the level's sending."""
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
                if not self.ctx.sending:
                    break
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
        # The level has ended (ProcessContext.stop_sending): what was sent runs on, the backlog
        # included, and the runner collects it. The user idles until the runner stops it (a
        # task that returned would start the schedule again).
        while True:
            self._resume_backlog()
            gevent.sleep(0.05)

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
        streams = self.streams
        while True:
            intended, send = due
            if self.ctx.generative:
                _stream_one(self.environment, self.ctx, self.stream_client, send, intended)
                if not self.backlog:
                    return
                due = self.backlog.popleft()
                continue
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
            _fire(self.environment, self.ctx.model_of(klass), end - intended, error)
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
        stream_client = getattr(self, "stream_client", None)
        if stream_client is not None:
            stream_client.close()
        client = getattr(self, "infer_client", None)
        streams = getattr(self, "streams", None)
        if client is not None and streams is not None:
            gevent.spawn(_end_sequences, client, streams, self.pending, self.ctx.next_payload)
        elif client is not None:
            client.close()


USER_CLASSES: list[type[User]] = [ClosedLoopUser, OpenLoopUser]
