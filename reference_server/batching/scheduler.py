"""The threaded scheduler of one loaded model: the dynamic batcher or the default scheduler.

One :class:`Scheduler` per loaded model version owns the request queue (§3.3), the open batch
and the instance queue of batches waiting for an instance (§3.5). With ``dynamic_batching`` a
batcher thread runs the pure :func:`reference_server.batching.decide.decide` step whenever something
wakes it (an instance picking up a batch, a timer, or an arrival that Triton's rule lets wake
it: :meth:`Scheduler.arrival_wakes`); without it every request becomes its own batch at once
(Triton's "default scheduler").

Instance threads (:mod:`reference_server.batching.instances`) call :meth:`Scheduler.next_batch` to take
the oldest queued batch. All state is guarded by one lock with two conditions on it, one the
batcher waits on and one the instances wait on, and each change wakes only the side whose next
step depends on it: every wake-up is an OS context switch plus a GIL hand-over, and on the
request path those cost more than the batching logic itself. Callbacks into the model runtime
(rejections) run outside the lock.

For the same reason, with prefetching an *idle instance* runs the batcher steps itself while it
waits (same steps, same state, under the same lock, so the same decisions at the same moments):
at low load a request then goes from the frontend to the executing thread in one hand-over
instead of two. As soon as no instance is idle the batcher thread leads again, so batches keep
forming while every instance is busy (§3.5 prefetch). Without prefetching (priorities, queue
policies) the batcher thread always leads.

With the rate limiter on (``--rate-limit execution_count``, a :class:`Dispatch` given) batches
do not go to the shared instance queue: each newly formed batch is handed to the server's rate
limiter, which binds it to one instance once that instance may run, and the instance takes it
from its own mailbox (:meth:`Scheduler.deliver`, :meth:`Scheduler.next_batch`). Batches waiting
there do not count against the prefetch cap (§3.11), no instance-side merge happens, and the
batcher thread always leads. Lock order: the rate limiter's lock, then a scheduler's; a
scheduler never calls the rate limiter while it holds its own lock.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import sys
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

from reference_server.batching.decide import (
    IDLE_WAIT_S,
    BatchingParams,
    Candidate,
    OpenBatch,
    PriorityQueue,
    QueuePolicy,
    decide,
)
from reference_server.core.errors import Code, ServerError
from reference_server.core.types import InferRequest

#: Non-prefetch mode sweeps REJECT timeouts at least this often while no instance is free.
_SWEEP_INTERVAL_S = 0.5
_PR_SET_TIMERSLACK = 29
_TIMER_SLACK_NS = 1000
#: ``TRITONSERVER_DELAY_SCHEDULER`` polls the queue length this often (as Triton does).
_DELAY_POLL_S = 0.01


@dataclass(eq=False)
class Entry:
    """A request inside the scheduler.

    Attributes:
        request: The request.
        batch_size: ``bs(r) = max(1, request batch size)``.
        level: Priority level (0 when the model has no levels).
        enqueue_ns: Time of entry into the scheduler (``queue_start``).
        deadline_ns: Queue timeout deadline, or None.
        shape_key: Batch-compatibility key (§3.4 "required equal inputs").
        slot: preserve_ordering response slot, -1 when not used.
        context: Opaque per-request data of the model runtime (callback, cache key, ...).
    """

    request: InferRequest
    batch_size: int
    level: int = 0
    enqueue_ns: int = 0
    deadline_ns: int | None = None
    shape_key: Hashable = None
    slot: int = -1
    context: object = None

    def candidate(self) -> Candidate:
        return Candidate(self.batch_size, self.enqueue_ns, self.deadline_ns, self.shape_key)


@dataclass(eq=False)
class Batch:
    """A batch ("payload"): whole requests, in order, executed by one instance."""

    entries: list[Entry] = field(default_factory=list)
    size: int = 0
    sealed: bool = False
    started: bool = False
    queued: bool = False
    merge_blocked: bool = False

    @property
    def shape_key(self) -> Hashable:
        return self.entries[0].shape_key if self.entries else None

    def add(self, entries: list[Entry]) -> None:
        self.entries.extend(entries)
        self.size += sum(e.batch_size for e in entries)


RejectCallback = Callable[[Entry, str, ServerError], None]


class Dispatch(Protocol):
    """The server's rate limiter as a scheduler sees it (``instances.RateLimitedDispatch``).

    Both methods are called without the scheduler's lock held.
    """

    def submit(self, scheduler: Scheduler, batch: Batch) -> None:
        """Hand over a newly formed batch; it may still grow until an instance starts it."""

    def release(self, scheduler: Scheduler, slot: int) -> None:
        """Instance ``slot`` of ``scheduler`` finished executing its batch."""


class Scheduler:
    """Queue, batch formation and hand-off to instances for one model version.

    Args:
        model_name: For error messages.
        params: Batching parameters, or None for the default (non-batching) scheduler.
        default_policy: Queue policy of levels without their own.
        level_policies: ``priority_queue_policy``.
        priority_levels: ``priority_levels`` (0 = one queue).
        default_priority_level: Level of requests without a valid priority.
        instance_count: Non-passive instances that will call :meth:`next_batch`.
        preserve_ordering: Number each request when it enters a batch (``Entry.slot``).
        on_reject: Called (outside the lock) for requests dropped from the queue, with the
            failure reason (``"REJECTED"`` / ``"CANCELED"``) and the error to answer.
        delay_count: ``TRITONSERVER_DELAY_SCHEDULER``: hold the batcher until this many
            requests are queued (0 = off).
        clock_ns: Monotonic clock (injectable for tests).
        dispatch: The rate limiter to hand batches to (None = rate limiting off: instances
            take batches from the shared instance queue).
    """

    def __init__(
        self,
        model_name: str,
        params: BatchingParams | None,
        *,
        default_policy: QueuePolicy | None = None,
        level_policies: dict[int, QueuePolicy] | None = None,
        priority_levels: int = 0,
        default_priority_level: int = 0,
        instance_count: int = 1,
        preserve_ordering: bool = False,
        on_reject: RejectCallback | None = None,
        delay_count: int = 0,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        dispatch: Dispatch | None = None,
        equal_shapes: bool = False,
    ) -> None:
        self.model_name = model_name
        self.params = params
        self._default_policy = default_policy or QueuePolicy()
        self._queue: PriorityQueue[Entry] = PriorityQueue(self._default_policy, level_policies)
        self.priority_levels = priority_levels
        self.default_priority_level = default_priority_level
        self.instance_count = instance_count
        self.preserve_ordering = preserve_ordering
        self._on_reject = on_reject
        self._delay_count = delay_count
        self._clock = clock_ns
        # §3.5: prefetching (forming batches while every instance is busy) only without
        # priorities and queue policies, so that those still apply to waiting requests.
        self.prefetch = (
            priority_levels == 0
            and not level_policies
            and self._default_policy.default_timeout_us == 0
            and not self._default_policy.allow_timeout_override
            and self._default_policy.max_queue_size == 0
        )
        self._lock = threading.Lock()
        # The batcher waits on _cond (the name other code and tests know), instances on
        # _instances_cond; both share _lock, so every state change is still atomic.
        self._cond = threading.Condition(self._lock)
        self._instances_cond = threading.Condition(self._lock)
        self._open = Batch()
        # Triton's next_preferred_batch_size_ (Decision.next_preferred; 0 for a new open batch)
        # and queued_batch_size_ (the batch sizes waiting in the queue): arrival_wakes().
        self._next_preferred = 0
        self._queued_items = 0
        # The model makes requests share input shapes within a batch: every arrival wakes.
        self._equal_shapes = equal_shapes
        self._instance_queue: collections.deque[Batch] = collections.deque()
        self._idle_waiting = 0
        self._next_slot = 0
        self._earliest_deadline: int | None = None
        self._accepting = True
        self._batcher_done = params is None
        self._thread: threading.Thread | None = None
        # Rate limiting: batches handed over and not yet started, the formed batches still to
        # hand over (outside the lock), and each instance's mailbox with its condition.
        self._dispatch = dispatch
        self._dispatched_waiting = 0
        self._to_submit: list[Batch] = []
        self._mailboxes: dict[int, collections.deque[Batch]] = {}
        self._mail_conds: dict[int, threading.Condition] = {}

    # ---------------------------------------------------------------- life cycle

    def start(self) -> None:
        """Start the batcher thread (dynamic batching only)."""
        if self.params is not None and self._thread is None:
            self._thread = threading.Thread(
                target=self._batcher_loop, name=f"batcher-{self.model_name}", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Refuse new requests; queued ones are still batched and executed (drain)."""
        with self._cond:
            self._accepting = False
            self._cond.notify_all()
            self._instances_cond.notify_all()
            self._notify_mailboxes()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the batcher thread to finish draining."""
        if self._thread is not None:
            self._thread.join(timeout)

    # ---------------------------------------------------------------- producer side

    def level_for(self, priority: int) -> int:
        """Map a request priority to a queue level (§3.2: out of range -> default level)."""
        if self.params is None or self.priority_levels == 0:
            return 0
        if 1 <= priority <= self.priority_levels:
            return priority
        return self.default_priority_level

    def deadline_for(self, level: int, timeout_us: int, enqueue_ns: int) -> int | None:
        """The queue deadline of a request at ``level`` asking for ``timeout_us``."""
        if self.params is None:
            return None
        effective = self._queue.policy(level).timeout_us(timeout_us)
        return enqueue_ns + effective * 1000 if effective else None

    def reserve_slot(self) -> int:
        """Reserve the next preserve_ordering slot (cache hits reserve theirs at arrival)."""
        with self._cond:
            slot = self._next_slot
            self._next_slot += 1
            return slot

    def enqueue(self, entry: Entry) -> None:
        """Add a request; sets ``entry.enqueue_ns``/``level``/``deadline_ns``.

        Raises:
            ServerError: UNAVAILABLE when the server is stopping or the level is full.
        """
        req = entry.request
        rid = req.id or "<id_unknown>"
        with self._cond:
            if not self._accepting:
                raise ServerError(
                    f"[request id: {rid}] Server is stopping, scheduler for model has stopped "
                    "accepting new inference requests",
                    Code.UNAVAILABLE,
                )
            # An entry that arrives with a time (from the sequence batcher, oldest strategy)
            # keeps it as its queue start, as Triton's dynamic batcher does in that role.
            arrived = entry.enqueue_ns
            entry.enqueue_ns = self._clock()
            req.queue_start_ns = arrived or entry.enqueue_ns
            if self.params is not None:
                self._enqueue_batching(entry, rid)
                return
            # Default scheduler: every request is its own payload, FIFO, no policies.
            batch = Batch(sealed=True, queued=True)
            self._assign_slots([entry])
            batch.add([entry])
            dispatch = self._dispatch
            if dispatch is None:
                self._instance_queue.append(batch)
                self._instances_cond.notify()
                return
            self._dispatched_waiting += 1
        dispatch.submit(self, batch)  # outside the lock (lock order)

    def _enqueue_batching(self, entry: Entry, rid: str) -> None:
        """Under the lock: queue a request of a dynamic batcher."""
        req = entry.request
        entry.level = self.level_for(req.priority)
        entry.deadline_ns = self.deadline_for(entry.level, req.timeout_us, entry.enqueue_ns)
        limit = self._queue.policy(entry.level).max_queue_size
        if limit and self._queue.level_size(entry.level) >= limit:
            raise ServerError(f"[request id: {rid}] Exceeds maximum queue size", Code.UNAVAILABLE)
        self._queue.push(entry.level, entry)
        self._queued_items += entry.batch_size
        if entry.deadline_ns is not None and (
            self._earliest_deadline is None or entry.deadline_ns < self._earliest_deadline
        ):
            self._earliest_deadline = entry.deadline_ns
        if self.arrival_wakes():
            self._notify_leader()

    def arrival_wakes(self) -> bool:
        """Under the lock: whether a new arrival makes the batcher step now (Triton's Enqueue).

        With prefetching and no shape checks, Triton wakes its batcher for an arrival only
        when the open batch is sealed or started, or the queue holds at least the next
        preferred size the last step computed (``Decision.next_preferred``: 0, so always,
        without a queue delay). So once a batch waiting for a busy instance holds a request
        and the delay is set, later arrivals stay queued until an instance takes a batch
        (which wakes the batcher), the queue reaches that size, or the batcher's idle timer
        (``decide.IDLE_WAIT_S``) fires; they do not join the waiting batch one by one. Under
        load that splits executions into small batches and full ones (measured on Triton
        2.51: 25 % of executions at max batch 16 with a 2 ms delay, 3 % without).
        """
        return not self._holds_arrivals() or self._queued_items >= self._next_preferred

    def _holds_arrivals(self) -> bool:
        """Under the lock: an arrival may stay queued without waking the batcher
        (:meth:`arrival_wakes`), so an idle batcher needs its timer."""
        return (
            self.prefetch
            and not self._equal_shapes
            and not (self._open.sealed or self._open.started)
            and self._next_preferred > 0
        )

    def wake(self) -> None:
        """Make the batcher look at its queue now (e.g. a queued request was cancelled)."""
        with self._cond:
            self._cond.notify_all()
            self._instances_cond.notify_all()
            self._notify_mailboxes()

    def queued_count(self) -> int:
        """Requests waiting in the scheduler queue (not yet in a batch)."""
        with self._cond:
            return len(self._queue)

    # ---------------------------------------------------------------- consumer side

    def next_batch(self, slot: int = 0) -> Batch | None:
        """Block until a batch is ready for this instance; None once drained and stopped.

        While an instance waits here with prefetching on, it runs the batcher's steps itself
        (see :meth:`_instance_led`): the batch it forms is the one the batcher thread would
        have formed at that moment, but the request skips one thread hand-over on its way to
        execution. The batcher thread takes over again whenever no instance is idle.

        Args:
            slot: Which instance asks (its index among the model's non-passive instances);
                only the rate limiter tells instances apart.
        """
        if self._dispatch is not None:
            return self._next_dispatched(slot)
        while True:
            dropped: list[tuple[Entry, str]] = []
            with self._cond:
                self._idle_waiting += 1
                try:
                    batch = self._wait_for_batch(dropped)
                finally:
                    self._idle_waiting -= 1
                if batch is not None:
                    self._after_pop()
                    return batch
                if not dropped:
                    return None
            self._reject(dropped)  # outside the lock, then look again

    def _wait_for_batch(self, dropped: list[tuple[Entry, str]]) -> Batch | None:
        """Under the lock: pop the next batch, or None when stopped or ``dropped`` was filled."""
        if not self.prefetch:
            # Non-prefetch: an idle instance is what lets the batcher form a batch.
            self._cond.notify()
        while not self._instance_queue:
            if not self._accepting and self._batcher_done:
                return None
            timeout: float | None = None
            if self._instance_led():
                timeout = self._run_steps(dropped)
                if dropped:
                    return None
                if self._instance_queue:
                    break
            self._instances_cond.wait(timeout)
        was_full = not self._slot_available()
        batch = self._instance_queue.popleft()
        batch.started = True
        self._merge_following(batch)
        # The batcher cares when a prefetch slot frees up, or when the batch it is still
        # filling was taken while requests wait (it decides anew for an empty batch);
        # otherwise leave it asleep: its next event (an arrival) comes anyway.
        if not self.prefetch or was_full or (self._open.started and self._queue):
            self._cond.notify()
        return batch

    def _next_dispatched(self, slot: int) -> Batch | None:
        """Rate limiting: wait for the batch the rate limiter bound to instance ``slot``."""
        with self._cond:
            box = self._mailbox(slot)
            cond = self._mail_conds[slot]
            self._idle_waiting += 1
            if not self.prefetch:
                self._cond.notify()  # an idle instance is what lets the batcher form a batch
            try:
                while not box:
                    if self._dispatch_drained():
                        return None
                    cond.wait()
            finally:
                self._idle_waiting -= 1
            batch = box.popleft()
            batch.started = True
            self._dispatched_waiting -= 1
            # The batcher opens a new batch for what is still queued.
            self._cond.notify()
            if self._dispatch_drained():
                self._notify_mailboxes()  # the others may stop now
            return batch

    def deliver(self, slot: int, batch: Batch) -> None:
        """The rate limiter bound ``batch`` to instance ``slot`` (called under its lock)."""
        with self._cond:
            self._mailbox(slot).append(batch)
            self._mail_conds[slot].notify()

    def _mailbox(self, slot: int) -> collections.deque[Batch]:
        if slot not in self._mailboxes:
            self._mailboxes[slot] = collections.deque()
            self._mail_conds[slot] = threading.Condition(self._lock)
        return self._mailboxes[slot]

    def _notify_mailboxes(self) -> None:
        for cond in self._mail_conds.values():
            cond.notify_all()

    def _dispatch_drained(self) -> bool:
        return not self._accepting and self._batcher_done and self._dispatched_waiting == 0

    def _after_pop(self) -> None:
        # This instance is busy from now on: requests still queued need whoever leads now
        # (another idle instance, or the batcher thread when none is idle).
        if self._queue:
            self._notify_leader()

    def batch_done(self, slot: int = 0) -> None:
        """An instance finished a batch.

        Only the non-prefetch batcher waits for this (it forms a batch only for an idle
        instance); with prefetching a finished execution changes nothing it looks at. With
        the rate limiter on, the instance's resources go back (call without the lock held).
        """
        if self._dispatch is not None:
            self._dispatch.release(self, slot)
        elif not self.prefetch:
            with self._cond:
                self._cond.notify()

    def _merge_following(self, batch: Batch) -> None:
        # §3.6 instance-side merge: absorb prefetched batches whose oldest request has waited
        # longer than the delay, while they fit and are shape-compatible.
        params = self.params
        if params is None or batch.merge_blocked or params.max_queue_delay_ns == 0:
            return
        mbs = max(1, params.max_batch_size)
        if mbs <= 1:
            return
        now = self._clock()
        while self._instance_queue:
            nxt = self._instance_queue[0]
            if nxt.merge_blocked or not nxt.entries:
                break
            oldest = min(e.enqueue_ns for e in nxt.entries)
            if now - oldest <= params.max_queue_delay_ns:
                break
            if batch.size + nxt.size > mbs or nxt.shape_key != batch.shape_key:
                break
            self._instance_queue.popleft()
            batch.add(nxt.entries)
            nxt.started = True

    # ---------------------------------------------------------------- the batcher thread

    def _slot_available(self) -> bool:
        if self._dispatch is not None:
            # §3.11: batches held by the rate limiter are not capped; without prefetching a
            # batch is formed only for an idle instance that no handed-over batch waits for.
            return self.prefetch or self._idle_waiting > self._dispatched_waiting
        if self.prefetch:
            return len(self._instance_queue) < 2 * max(1, self.instance_count)
        return self._idle_waiting > len(self._instance_queue)

    def _assign_slots(self, entries: list[Entry]) -> None:
        if self.preserve_ordering:
            for entry in entries:
                entry.slot = self._next_slot
                self._next_slot += 1

    def _instance_led(self) -> bool:
        """Whether idle instances form batches now instead of the batcher thread.

        Only with prefetching (no priorities or queue policies, so a step never depends on
        which thread runs it or on instance availability), outside the delayed start and while
        accepting (draining on stop is the batcher's job, as is marking it done).
        """
        return (
            self.prefetch
            and self._dispatch is None
            and self.params is not None
            and self._idle_waiting > 0
            and self._accepting
            and not self._delay_count
        )

    def _notify_leader(self) -> None:
        """Wake whoever forms batches now: an idle instance, or the batcher thread."""
        if self._instance_led():
            self._instances_cond.notify()
        else:
            self._cond.notify()

    def _reject(self, dropped: list[tuple[Entry, str]]) -> None:
        """Answer requests dropped from the queue (outside the lock)."""
        for entry, reason in dropped:
            if self._on_reject is None:
                continue
            if reason == "CANCELED":
                error = ServerError("", Code.CANCELLED)
            else:
                error = ServerError("Request timeout expired", Code.UNAVAILABLE)
            self._on_reject(entry, reason, error)

    def _batcher_loop(self) -> None:
        assert self.params is not None
        reduce_timer_slack()
        while True:
            dropped: list[tuple[Entry, str]] = []
            with self._cond:
                while True:
                    if not self._accepting and not self._queue:
                        self._batcher_done = True
                        self._instances_cond.notify_all()
                        self._notify_mailboxes()
                        return
                    if self._delay_count:
                        if len(self._queue) < self._delay_count and self._accepting:
                            self._cond.wait(_DELAY_POLL_S)
                            continue
                        self._delay_count = 0
                    if self._instance_led():
                        # An idle instance forms the batches (and hands back when it gets
                        # busy); make sure one looks at what is queued.
                        if self._queue:
                            self._instances_cond.notify()
                        self._cond.wait()
                        continue
                    timeout = self._run_steps(dropped)
                    if dropped or self._to_submit:
                        break
                    if not self._accepting and not self._queue:
                        continue  # drained while stopping: the first check above ends the loop
                    self._cond.wait(timeout)
                submit, self._to_submit = self._to_submit, []
            if self._dispatch is not None:
                for batch in submit:  # outside the lock (lock order)
                    self._dispatch.submit(self, batch)
            self._reject(dropped)

    def _run_steps(self, dropped: list[tuple[Entry, str]]) -> float | None:
        """Run batcher steps (§3.4) until one would wait; under the lock, on any thread.

        Returns:
            How long to wait for the next step (None = until an event). When requests were
            dropped from the queue (cancelled, timed out) they are appended to ``dropped`` and
            the caller answers them outside the lock before stepping again.
        """
        params = self.params
        assert params is not None
        # The scan never looks past MBS + 1 entries, so only that prefix matters.
        scan_limit = max(1, params.max_batch_size) + 1
        while True:
            if self._open.sealed or self._open.started:
                self._open = Batch()
                self._next_preferred = 0
            now = self._clock()
            head = list(itertools.islice(self._queue, scan_limit))
            due = self._earliest_deadline is not None and now >= self._earliest_deadline
            if due or any(e.request.cancelled for e in head):
                swept = self._queue.sweep(_is_cancelled, _expired_at(now))
                self._earliest_deadline = min(
                    (e.deadline_ns for e in self._queue if e.deadline_ns is not None),
                    default=None,
                )
                if swept:
                    self._queued_items -= sum(entry.batch_size for entry, _ in swept)
                    dropped.extend(swept)
                    return None
                head = list(itertools.islice(self._queue, scan_limit))
            if not head:
                # Requests that arrive without waking the batcher (arrival_wakes) are taken in
                # on Triton's idle timer at the latest.
                return IDLE_WAIT_S if self._holds_arrivals() else None
            if not self._slot_available():
                return None if self.prefetch else _SWEEP_INTERVAL_S
            decision = decide(
                [e.candidate() for e in head],
                OpenBatch(self._open.size, self._open.shape_key),
                params,
                now,
            )
            if decision.merge_blocked:
                self._open.merge_blocked = True
            if decision.next_preferred is not None:
                self._next_preferred = decision.next_preferred
            if decision.take:
                taken = self._queue.pop_front(decision.take)
                self._queued_items -= sum(entry.batch_size for entry in taken)
                self._assign_slots(taken)
                self._open.add(taken)
                if not self._open.queued:
                    self._open.queued = True
                    if self._dispatch is None:
                        self._instance_queue.append(self._open)
                        self._instances_cond.notify()
                    else:
                        self._dispatched_waiting += 1
                        self._to_submit.append(self._open)
            if decision.seal:
                self._open.sealed = True
            if decision.take or (decision.seal and self._open.size):
                continue
            # Nothing to send yet: sleep until the delay of the oldest pending request or the
            # nearest queue deadline, or until an event.
            wake = decision.wake_at_ns
            if self._earliest_deadline is not None:
                wake = (
                    self._earliest_deadline if wake is None else min(wake, self._earliest_deadline)
                )
            return None if wake is None else max(0.0, (wake - now) / 1e9)


def reduce_timer_slack() -> None:
    """Ask Linux to wake this thread's timed waits on time (default slack is 50 µs).

    Queue delays are often a few hundred µs; the default slack would add a visible, avoidable
    overshoot to every one. Elsewhere (or if prctl is unavailable) nothing changes.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(_TIMER_SLACK_NS), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _is_cancelled(entry: Entry) -> bool:
    return entry.request.cancelled


def _expired_at(now_ns: int) -> Callable[[Entry], bool]:
    def expired(entry: Entry) -> bool:
        return entry.deadline_ns is not None and now_ns >= entry.deadline_ns

    return expired
