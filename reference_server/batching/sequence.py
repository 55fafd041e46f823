"""The sequence batcher (``sequence_batching``): stateful models, as Triton schedules them.

Triton's ``SequenceBatchScheduler`` (``core/src/sequence_batch_scheduler/``) gives every model
instance a number of *sequence slots* (``max_batch_size``, or ``oldest.max_candidate_sequences``)
and binds each live sequence (correlation id) to one slot from its START request until its END
request; sequences that find no free slot wait in a *backlog* and take the next slot that is
released. The model sees control tensors on every request (``control_input``: START, END, READY
as int32 / fp32 / bool values, CORRID as the correlation id) and keeps its state per sequence.

Two strategies form the batches of an instance:

* ``direct``: one batch per execution holds the front request of every slot ``0..k`` (``k`` the
  highest slot with a request), slot ``i`` at batch index ``i``; an empty slot below ``k`` gets
  a *null* request (READY false) so indices stay aligned. ``max_queue_delay_microseconds`` and
  ``minimum_slot_utilization`` may hold a batch back (:func:`direct_step`).
* ``oldest``: every slot issues at most one request at a time to the instance's own dynamic
  batcher (the same :class:`~reference_server.batching.scheduler.Scheduler` as
  ``dynamic_batching``, with ``oldest``'s preferred sizes and queue delay); the next request of
  a sequence is issued when the previous one has executed (:class:`OldestSlots`). Batch
  formation is then :func:`~reference_server.batching.decide.decide` over the issued requests.

``max_sequence_idle_microseconds`` (default 1 s): a sequence without a request for that long
loses its slot (the reaper); a later request of that id without START is refused, as by Triton.
When the model stops, requests still in the backlog are answered UNAVAILABLE.

The pure parts -- :class:`SequenceRouter` (slots, backlog, idle sequences), :class:`OldestSlots`,
:func:`direct_step` and :class:`Controls` -- take no locks and no clock of their own;
:class:`SequenceScheduler` runs them under one lock with threads. Not modelled: implicit state
(``sequence_batching.state``), iterative sequences, backlog expiry by request timeout, the rate
limiter (sequence models take their instances directly), cancellation of queued sequence
requests (they run); :func:`unsupported` names what a load refuses.
"""

from __future__ import annotations

import collections
import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.batching.decide import BatchingParams
from reference_server.batching.scheduler import Batch, Entry, RejectCallback, Scheduler
from reference_server.core.config import SEQUENCE_IDLE_DEFAULT_US
from reference_server.core.errors import Code, ServerError
from reference_server.core.types import InferRequest

CorrelationId = int | str
T = TypeVar("T")

#: Direct strategy: how long the batcher waits when nothing is queued (Triton's 500 ms).
_DIRECT_IDLE_WAIT_S = 0.5


# ------------------------------------------------------------------------------ request fields


@dataclass(frozen=True)
class SequenceInfo:
    """The sequence fields of one request (``sequence_id``/``_start``/``_end`` parameters).

    Attributes:
        correlation_id: uint64 or string; 0 / "" when the request names no sequence.
        start: First request of the sequence.
        end: Last request of the sequence.
    """

    correlation_id: CorrelationId = 0
    start: bool = False
    end: bool = False


def set_sequence(request: InferRequest, info: SequenceInfo) -> None:
    """Attach the sequence fields a frontend parsed to ``request``."""
    request.sequence_id = info.correlation_id
    request.sequence_start = info.start
    request.sequence_end = info.end


def sequence_of(request: InferRequest) -> SequenceInfo:
    """The sequence fields of ``request`` (all defaults when it carried none)."""
    return SequenceInfo(request.sequence_id, request.sequence_start, request.sequence_end)


def correlation_text(correlation_id: CorrelationId) -> str:
    """How Triton prints a correlation id in messages."""
    return str(correlation_id)


# ------------------------------------------------------------------------------ control tensors


@dataclass(frozen=True)
class BoolControl:
    """A START / END / READY control input: its tensor and its false/true values."""

    name: str
    datatype: str  # "INT32" | "FP32" | "BOOL"
    false_value: float | int | bool
    true_value: float | int | bool


@dataclass(frozen=True)
class Controls:
    """The control inputs of a model (``sequence_batching.control_input``).

    Attributes:
        start: CONTROL_SEQUENCE_START, or None.
        end: CONTROL_SEQUENCE_END, or None.
        ready: CONTROL_SEQUENCE_READY, or None.
        corrid: CONTROL_SEQUENCE_CORRID ``(name, protocol datatype)``, or None.
        batching: The model batches (tensors get a leading batch dim of 1).
    """

    start: BoolControl | None = None
    end: BoolControl | None = None
    ready: BoolControl | None = None
    corrid: tuple[str, str] | None = None
    batching: bool = True

    @classmethod
    def from_config(cls, cfg: mc.ModelConfig) -> Controls:
        """Read the controls of a validated config."""
        kinds: dict[int, BoolControl] = {}
        corrid: tuple[str, str] | None = None
        kind = mc.ModelSequenceBatching.Control
        for control_input in cfg.sequence_batching.control_input:
            for control in control_input.control:
                if control.kind == kind.CONTROL_SEQUENCE_CORRID:
                    corrid = (control_input.name, _PROTOCOL[control.data_type])
                    continue
                values: list[float | int | bool]
                if control.int32_false_true:
                    values = [int(v) for v in control.int32_false_true]
                    datatype = "INT32"
                elif control.fp32_false_true:
                    values = [float(v) for v in control.fp32_false_true]
                    datatype = "FP32"
                else:
                    values = [bool(v) for v in control.bool_false_true]
                    datatype = "BOOL"
                kinds[control.kind] = BoolControl(control_input.name, datatype, *values)
        return cls(
            start=kinds.get(kind.CONTROL_SEQUENCE_START),
            end=kinds.get(kind.CONTROL_SEQUENCE_END),
            ready=kinds.get(kind.CONTROL_SEQUENCE_READY),
            corrid=corrid,
            batching=cfg.max_batch_size > 0,
        )

    def tensors(self, info: SequenceInfo, *, ready: bool = True) -> dict[str, np.ndarray]:
        """The control tensors of one request (a null request has ``ready=False``)."""
        out: dict[str, np.ndarray] = {}
        shape = (1, 1) if self.batching else (1,)
        start = ready and info.start
        end = ready and info.end
        for control, value in ((self.start, start), (self.end, end), (self.ready, ready)):
            if control is not None:
                chosen = control.true_value if value else control.false_value
                out[control.name] = np.full(shape, chosen, dtype=_NUMPY[control.datatype])
        if self.corrid is not None:
            name, datatype = self.corrid
            cid = info.correlation_id if ready else 0
            if datatype == "BYTES":
                out[name] = np.full(shape, str(cid).encode(), dtype=np.object_)
            else:
                out[name] = _integer_corrid(cid, datatype).reshape(shape)
        return out

    def datatypes(self) -> dict[str, str]:
        """Protocol datatype of every control tensor, by name."""
        out = {c.name: c.datatype for c in (self.start, self.end, self.ready) if c is not None}
        if self.corrid is not None:
            out[self.corrid[0]] = self.corrid[1]
        return out


def _integer_corrid(cid: CorrelationId, datatype: str) -> np.ndarray:
    """What Triton 2.51 writes into an integer CORRID tensor (a C memcpy of the id's bytes).

    A uint64 id gives its low bytes. Triton 2.51 does not refuse a string id for an integer
    CORRID (later versions do): it copies the id's serialized form (uint32 length, then the
    bytes) into the tensor, truncated to its size; here the bytes it does not write are zero.
    """
    dtype = np.dtype(_NUMPY[datatype])
    if isinstance(cid, str):
        text = cid.encode()
        raw = len(text).to_bytes(4, "little") + text
    else:
        raw = (int(cid) & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little")
    raw = raw[: dtype.itemsize].ljust(dtype.itemsize, b"\0")
    return np.frombuffer(raw, dtype=dtype).copy()


_PROTOCOL = {
    mc.TYPE_UINT64: "UINT64",
    mc.TYPE_INT64: "INT64",
    mc.TYPE_UINT32: "UINT32",
    mc.TYPE_INT32: "INT32",
    mc.TYPE_STRING: "BYTES",
}
_NUMPY = {
    "INT32": np.int32,
    "FP32": np.float32,
    "BOOL": np.bool_,
    "UINT64": np.uint64,
    "INT64": np.int64,
    "UINT32": np.uint32,
}


# ------------------------------------------------------------------------------ the router


@dataclass(frozen=True, order=True)
class SlotRef:
    """One sequence slot: ``seq_slot`` of instance ``instance``.

    Ordered by slot first: Triton hands out the lowest free slot number (across instances).
    """

    seq_slot: int
    instance: int


@dataclass(eq=False)
class _Backlog(Generic[T]):
    correlation_id: CorrelationId
    items: list[T] = field(default_factory=list)
    ended: bool = False


class UnknownSequence(LookupError):
    """A request without START for a sequence that has neither a slot nor a backlog."""


class SequenceRouter(Generic[T]):
    """Correlation ids to sequence slots, the backlog and idle sequences (pure, no locks).

    Args:
        slots: Every slot of every instance.
        max_idle_us: ``max_sequence_idle_microseconds``.
    """

    def __init__(self, slots: Sequence[SlotRef], max_idle_us: int) -> None:
        self._ready: list[SlotRef] = sorted(slots)
        heapq.heapify(self._ready)
        self._bound: dict[CorrelationId, SlotRef] = {}
        self._backlogs: collections.deque[_Backlog[T]] = collections.deque()
        self._collecting: dict[CorrelationId, _Backlog[T]] = {}
        self._last_us: dict[CorrelationId, int] = {}
        self.max_idle_us = max_idle_us

    def known(self, correlation_id: CorrelationId) -> bool:
        """The id has a slot or a backlog (a request without START is accepted)."""
        return correlation_id in self._bound or correlation_id in self._collecting

    def route(self, info: SequenceInfo, item: T, now_us: int) -> SlotRef | None:
        """Place one request (``SequenceBatchScheduler::Enqueue``).

        Returns:
            The slot to queue ``item`` on, or None when it went to the backlog.

        Raises:
            UnknownSequence: no START and the id is unknown (Triton's reply:
                :func:`missing_start`).
        """
        cid = info.correlation_id
        if not info.start and not self.known(cid):
            raise UnknownSequence(cid)
        self._last_us[cid] = now_us
        slot = self._bound.get(cid)
        if slot is None and cid in self._collecting:
            backlog = self._collecting[cid]
            backlog.items.append(item)
            if info.end:
                backlog.ended = True
                del self._collecting[cid]
            return None
        if slot is None and self._ready:
            slot = heapq.heappop(self._ready)
            self._bound[cid] = slot
        if slot is None:
            backlog = _Backlog(cid, [item], ended=info.end)
            self._backlogs.append(backlog)
            if not info.end:
                self._collecting[cid] = backlog
            return None
        if info.end:
            del self._bound[cid]
        return slot

    def release(self, slot: SlotRef) -> tuple[CorrelationId, list[T]] | None:
        """A slot's sequence ended (or was force-ended): hand it to the oldest backlog.

        Returns:
            The backlogged sequence now bound to ``slot`` and its requests, or None when no
            sequence waits (the slot is free again).
        """
        while self._backlogs:
            backlog = self._backlogs.popleft()
            if not backlog.items:
                continue
            cid = backlog.correlation_id
            if not backlog.ended:
                self._collecting.pop(cid, None)
                self._bound[cid] = slot
            return cid, backlog.items
        heapq.heappush(self._ready, slot)
        return None

    def reap(self, now_us: int) -> tuple[list[tuple[CorrelationId, SlotRef]], int | None]:
        """Sequences idle longer than ``max_idle_us`` (Triton's reaper thread).

        Returns:
            ``(correlation id, slot)`` of every idle sequence holding a slot (now unbound: the
            caller force-ends it on that slot), and when to look again (µs, None = nothing to
            watch). Idle sequences still in the backlog are looked at again later.
        """
        ended: list[tuple[CorrelationId, SlotRef]] = []
        next_us: int | None = None
        for cid, last in list(self._last_us.items()):
            due = last + self.max_idle_us
            if now_us < due:
                next_us = due if next_us is None else min(next_us, due)
                continue
            if cid in self._bound:
                ended.append((cid, self._bound.pop(cid)))
                del self._last_us[cid]
            elif cid in self._collecting:
                retry = now_us + min(self.max_idle_us, 50_000)
                next_us = retry if next_us is None else min(next_us, retry)
            else:
                del self._last_us[cid]  # ended normally
        return ended, next_us

    def backlog_size(self) -> int:
        """Requests waiting in the backlog."""
        return sum(len(b.items) for b in self._backlogs)

    def drain(self) -> list[T]:
        """Empty the backlog (the model stops): its requests, oldest sequence first."""
        items = [item for backlog in self._backlogs for item in backlog.items]
        self._backlogs.clear()
        self._collecting.clear()
        return items


def missing_start(correlation_id: CorrelationId, model_name: str) -> ServerError:
    """Triton's reply to a request of an unknown sequence without START."""
    return ServerError(
        f"inference request for sequence {correlation_text(correlation_id)} to model "
        f"'{model_name}' must specify the START flag on the first request of the sequence",
        Code.INVALID_ARG,
    )


# ------------------------------------------------------------------------------ oldest strategy


class OldestSlots(Generic[T]):
    """The slot queues of one instance under ``oldest`` (pure).

    Each slot issues at most one request at a time to the instance's dynamic batcher; a None
    item is a force-end marker (idle sequence). :meth:`push` says whether the slot is idle and
    :meth:`advance` what to issue next (``OldestSequenceBatch::CompleteAndNext``); the caller
    hands the issued requests to the dynamic batcher, whose batches :func:`decide` forms.
    """

    def __init__(self, slot_count: int) -> None:
        self.queues: list[collections.deque[T | None]] = [
            collections.deque() for _ in range(slot_count)
        ]
        self.in_flight = [False] * slot_count

    def push(self, seq_slot: int, item: T | None) -> bool:
        """Queue an item; True when the slot is idle (call :meth:`next` now)."""
        self.queues[seq_slot].append(item)
        return not self.in_flight[seq_slot]

    def next(self, seq_slot: int, is_end: Callable[[T], bool]) -> tuple[T | None, bool]:
        """The slot's previous request is done (or there was none): what comes next.

        Returns:
            ``(item to issue or None, release)``: ``release`` says the slot's sequence is over
            (an END request was issued, or a force-end marker was met) and the slot must go
            back to the router, whose answer goes in with :meth:`push`.
        """
        self.in_flight[seq_slot] = False
        queue = self.queues[seq_slot]
        if not queue:
            return None, False
        item = queue.popleft()
        if item is None:
            return None, True
        self.in_flight[seq_slot] = True
        return item, is_end(item)

    def advance(
        self,
        seq_slot: int,
        is_end: Callable[[T], bool],
        release: Callable[[], list[T] | None],
    ) -> T | None:
        """The slot's previous request executed (or the slot was idle): move it on.

        ``release`` is called when the slot's sequence is over; it returns the requests of
        the backlogged sequence that takes the slot (None: the slot is free).

        Returns:
            The request to issue to the dynamic batcher now, if any.
        """
        while True:
            item, over = self.next(seq_slot, is_end)
            if not over:
                return item
            handed = release()
            if handed is None:
                return item
            self.queues[seq_slot].extend(handed)
            if item is not None:
                return item  # the END request still runs; the backlog follows when it is done

    def queued(self) -> int:
        """Requests waiting in slot queues (markers excluded)."""
        return sum(sum(1 for i in q if i is not None) for q in self.queues)


# ------------------------------------------------------------------------------ direct strategy


@dataclass(frozen=True)
class DirectStep:
    """One step of the direct strategy (``DirectSequenceBatch::BatcherThread``).

    Attributes:
        slots: Slots ``0..k`` that make the batch (empty: no batch now).
        null_slots: The subset of ``slots`` that gets a null request.
        wait_ns: When ``slots`` is empty: how long to wait (None = until an event).
    """

    slots: tuple[int, ...] = ()
    null_slots: tuple[int, ...] = ()
    wait_ns: int | None = None


def direct_step(
    fronts: Sequence[int | None],
    now_ns: int,
    *,
    max_batch_size: int,
    max_queue_delay_ns: int,
    minimum_slot_utilization: float,
) -> DirectStep:
    """Which slots form the next direct batch.

    Args:
        fronts: Per slot, the enqueue time of its front request (None = empty).
        now_ns: The clock.
        max_batch_size: ``max(1, max_batch_size)``.
        max_queue_delay_ns: ``direct.max_queue_delay_microseconds`` in ns.
        minimum_slot_utilization: ``direct.minimum_slot_utilization``.
    """
    ready = [i for i, t in enumerate(fronts) if t is not None]
    if not ready:
        return DirectStep()
    top = ready[-1]
    if max_queue_delay_ns > 0 and minimum_slot_utilization > 0.0:
        oldest = min(t for t in fronts if t is not None)
        waited = now_ns - oldest
        utilization = len(ready) / max(1, max_batch_size)
        if waited <= max_queue_delay_ns and utilization < minimum_slot_utilization:
            return DirectStep(wait_ns=max_queue_delay_ns - waited)
    slots = tuple(range(top + 1))
    return DirectStep(slots, tuple(i for i in slots if fronts[i] is None))


# ------------------------------------------------------------------------------ the scheduler


@dataclass(frozen=True)
class SequenceParams:
    """``sequence_batching`` as the scheduler needs it.

    Attributes:
        oldest: The oldest strategy (False: direct).
        slots_per_instance: Sequence slots of each instance.
        max_batch_size: ``max(1, max_batch_size)``.
        max_queue_delay_ns: The strategy's ``max_queue_delay_microseconds`` in ns.
        preferred: ``oldest.preferred_batch_size``.
        minimum_slot_utilization: ``direct.minimum_slot_utilization``.
        max_idle_us: ``max_sequence_idle_microseconds``.
    """

    oldest: bool
    slots_per_instance: int
    max_batch_size: int
    max_queue_delay_ns: int = 0
    preferred: frozenset[int] = frozenset()
    minimum_slot_utilization: float = 0.0
    max_idle_us: int = SEQUENCE_IDLE_DEFAULT_US

    @classmethod
    def from_config(cls, cfg: mc.ModelConfig) -> SequenceParams:
        """Read a normalized, validated config."""
        sb = cfg.sequence_batching
        mbs = max(1, cfg.max_batch_size)
        idle = int(sb.max_sequence_idle_microseconds) or SEQUENCE_IDLE_DEFAULT_US
        if sb.HasField("oldest"):
            candidates = int(sb.oldest.max_candidate_sequences)
            return cls(
                oldest=True,
                slots_per_instance=candidates if candidates > 0 else mbs,
                max_batch_size=mbs,
                max_queue_delay_ns=int(sb.oldest.max_queue_delay_microseconds) * 1000,
                preferred=frozenset(int(p) for p in sb.oldest.preferred_batch_size),
                max_idle_us=idle,
            )
        return cls(
            oldest=False,
            slots_per_instance=mbs,
            max_batch_size=mbs,
            max_queue_delay_ns=int(sb.direct.max_queue_delay_microseconds) * 1000,
            minimum_slot_utilization=float(sb.direct.minimum_slot_utilization),
            max_idle_us=idle,
        )


class SequenceScheduler(Scheduler):
    """The sequence batcher of one model version, with the interface of :class:`Scheduler`.

    Instance ``k`` (its slot among the non-passive instances) takes batches formed from its own
    sequence slots. With ``oldest`` each instance has a dynamic batcher (a plain
    :class:`Scheduler` fed one request per slot at a time); with ``direct`` the instance forms
    its batch itself when it asks for one, as Triton forms the next direct batch only once the
    previous one executed. A reaper thread frees the slots of idle sequences.

    Args:
        model_name: For messages.
        params: The ``sequence_batching`` settings.
        controls: The model's control inputs.
        instance_count: Non-passive instances.
        on_reject: Answers requests that are dropped.
        clock_ns: Monotonic clock.
    """

    def __init__(
        self,
        model_name: str,
        params: SequenceParams,
        controls: Controls,
        *,
        instance_count: int = 1,
        on_reject: RejectCallback | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        super().__init__(
            model_name, None, instance_count=instance_count, on_reject=on_reject, clock_ns=clock_ns
        )
        self.sequence_params = params
        self.controls = controls
        self._seq_clock = clock_ns
        count = max(1, instance_count)
        slots = [SlotRef(s, i) for i in range(count) for s in range(params.slots_per_instance)]
        self._router: SequenceRouter[Entry] = SequenceRouter(slots, params.max_idle_us)
        self._seq_lock = threading.Lock()
        self._seq_cond = threading.Condition(self._seq_lock)
        # The reaper waits on its own condition: an arrival wakes it only when it watches
        # nothing (a new timestamp is never due before the ones it already waits for).
        self._reaper_cond = threading.Condition(self._seq_lock)
        self._reaper_idle = False
        self._seq_accepting = True
        self._reaper: threading.Thread | None = None
        self._reaper_stop = False
        self._slot_of: dict[int, SlotRef] = {}
        self._running: dict[int, Batch | None] = {}
        # oldest: slot queues + one dynamic batcher per instance.
        self._oldest: list[OldestSlots[Entry]] = []
        self._batchers: list[Scheduler] = []
        # direct: slot queues (None = force-end marker) per instance.
        self._direct: list[list[collections.deque[Entry | None]]] = []
        if params.oldest:
            batching = BatchingParams(
                max_batch_size=params.max_batch_size,
                preferred=params.preferred,
                max_queue_delay_ns=params.max_queue_delay_ns,
            )
            for i in range(count):
                self._oldest.append(OldestSlots(params.slots_per_instance))
                self._batchers.append(
                    Scheduler(
                        f"{model_name}[{i}]",
                        batching,
                        instance_count=1,
                        on_reject=self._dropped_issue(on_reject),
                        clock_ns=clock_ns,
                    )
                )
        else:
            self._direct = [
                [collections.deque() for _ in range(params.slots_per_instance)]
                for _ in range(count)
            ]

    # ---------------------------------------------------------------- life cycle

    def start(self) -> None:
        for batcher in self._batchers:
            batcher.start()
        if self._reaper is None:
            self._reaper = threading.Thread(
                target=self._reaper_loop, name=f"reaper-{self.model_name}", daemon=True
            )
            self._reaper.start()

    def stop(self) -> None:
        with self._seq_cond:
            self._seq_accepting = False
            self._seq_cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        """Wait until every slot's queued requests ran, then drain the batchers.

        Requests still in the backlog would wait for a slot whose sequence can no longer end:
        they are answered UNAVAILABLE.
        """
        with self._seq_cond:
            self._seq_cond.wait_for(self._drained, timeout)
            self._reaper_stop = True
            self._reaper_cond.notify_all()
            stranded = self._router.drain()
        if self._on_reject is not None:
            for entry in stranded:
                self._on_reject(entry, "REJECTED", _stopping())
        for batcher in self._batchers:
            batcher.stop()
            batcher.join(timeout)
        if self._reaper is not None:
            self._reaper.join(timeout)

    def _drained(self) -> bool:
        if self.sequence_params.oldest:
            return all(s.queued() == 0 and not any(s.in_flight) for s in self._oldest)
        return all(not any(e is not None for e in q) for qs in self._direct for q in qs)

    # ---------------------------------------------------------------- producer side

    def enqueue(self, entry: Entry) -> None:
        """Accept a request of a sequence (``SequenceBatchScheduler::Enqueue``).

        Raises:
            ServerError: INVALID_ARG for a batch size above 1 or a sequence without START,
                UNAVAILABLE when the model is stopping.
        """
        req = entry.request
        info = sequence_of(req)
        if req.batch_size > 1:
            raise ServerError(
                f"inference request to model '{self.model_name}' must specify batch-size 1 "
                "due to requirements of sequence batcher",
                Code.INVALID_ARG,
            )
        now = self._seq_clock()
        req.queue_start_ns = now
        entry.enqueue_ns = now
        with self._seq_cond:
            if not self._seq_accepting:
                raise _stopping()
            try:
                slot = self._router.route(info, entry, now // 1000)
            except UnknownSequence:
                raise missing_start(info.correlation_id, self.model_name) from None
            if self._reaper_idle:
                self._reaper_cond.notify()
            if slot is not None:
                self._place(slot, [entry])

    def _place(self, slot: SlotRef, entries: Sequence[Entry | None]) -> None:
        """Under the lock: queue requests (or a force-end marker) on a slot."""
        if self.sequence_params.oldest:
            slots = self._oldest[slot.instance]
            idle = False
            for item in entries:
                idle = slots.push(slot.seq_slot, item) or idle
            if idle:
                self._advance(slot)
        else:
            self._direct[slot.instance][slot.seq_slot].extend(entries)
            self._seq_cond.notify_all()

    def _advance(self, slot: SlotRef) -> None:
        """Oldest, under the lock: issue the slot's next request, release it when over."""

        def release() -> list[Entry] | None:
            handed = self._router.release(slot)
            return None if handed is None else handed[1]

        item = self._oldest[slot.instance].advance(slot.seq_slot, _is_end, release)
        if item is not None:
            self._issue(slot, item)

    def _dropped_issue(self, on_reject: RejectCallback | None) -> RejectCallback:
        """The instance batcher's answer to a request it dropped (cancelled: the client went
        away; timed out): answered as the batcher answers it, and its slot goes on to the
        sequence's next request as if it had run, or the slot would stay busy for good."""

        def dropped(entry: Entry, reason: str, error: ServerError) -> None:
            if on_reject is not None:
                on_reject(entry, reason, error)
            with self._seq_cond:
                where = self._slot_of.pop(id(entry), None)
                if where is not None:
                    self._advance(where)
                self._seq_cond.notify_all()

        return dropped

    def _issue(self, slot: SlotRef, entry: Entry) -> None:
        self._add_controls(entry.request, ready=True)
        self._slot_of[id(entry)] = slot
        self._batchers[slot.instance].enqueue(entry)

    def _add_controls(self, req: InferRequest, *, ready: bool) -> None:
        tensors = self.controls.tensors(sequence_of(req), ready=ready)
        req.inputs.update(tensors)
        req.input_datatypes.update({k: self.controls.datatypes()[k] for k in tensors})

    def wake(self) -> None:
        with self._seq_cond:
            self._seq_cond.notify_all()
        for batcher in self._batchers:
            batcher.wake()

    def queued_count(self) -> int:
        with self._seq_cond:
            if self.sequence_params.oldest:
                waiting = sum(s.queued() for s in self._oldest)
            else:
                waiting = sum(1 for qs in self._direct for q in qs for e in q if e is not None)
            waiting += self._router.backlog_size()
        return waiting + sum(b.queued_count() for b in self._batchers)

    # ---------------------------------------------------------------- consumer side

    def next_batch(self, slot: int = 0) -> Batch | None:
        if self.sequence_params.oldest:
            batch = self._batchers[slot].next_batch(0)
        else:
            batch = self._next_direct(slot)
        with self._seq_cond:
            self._running[slot] = batch
        return batch

    def batch_done(self, slot: int = 0) -> None:
        with self._seq_cond:
            batch = self._running.pop(slot, None)
            if self.sequence_params.oldest and batch is not None:
                for entry in batch.entries:
                    where = self._slot_of.pop(id(entry), None)
                    if where is not None:
                        self._advance(where)
            self._seq_cond.notify_all()
        if self.sequence_params.oldest:
            self._batchers[slot].batch_done(0)

    def _next_direct(self, instance: int) -> Batch | None:
        params = self.sequence_params
        queues = self._direct[instance]
        with self._seq_cond:
            while True:
                for seq_slot, queue in enumerate(queues):
                    while queue and queue[0] is None:  # force-ended: the slot goes back
                        queue.popleft()
                        self._direct_release(SlotRef(seq_slot, instance))
                fronts = [q[0].enqueue_ns if q and q[0] is not None else None for q in queues]
                step = direct_step(
                    fronts,
                    self._seq_clock(),
                    max_batch_size=params.max_batch_size,
                    max_queue_delay_ns=params.max_queue_delay_ns,
                    minimum_slot_utilization=params.minimum_slot_utilization,
                )
                if step.slots:
                    return self._direct_batch(instance, step)
                if not self._seq_accepting and self._drained():
                    return None
                wait = _DIRECT_IDLE_WAIT_S if step.wait_ns is None else step.wait_ns / 1e9
                self._seq_cond.wait(wait)

    def _direct_batch(self, instance: int, step: DirectStep) -> Batch:
        queues = self._direct[instance]
        template = next(q[0] for q in queues if q and q[0] is not None)
        assert template is not None
        batch = Batch(sealed=True, queued=True, started=True)
        for seq_slot in step.slots:
            if seq_slot in step.null_slots:
                batch.add([self._null_entry(template)])
                continue
            entry = queues[seq_slot].popleft()
            assert entry is not None
            self._add_controls(entry.request, ready=True)
            batch.add([entry])
            if _is_end(entry):
                self._direct_release(SlotRef(seq_slot, instance))
        return batch

    def _direct_release(self, slot: SlotRef) -> None:
        handed = self._router.release(slot)
        if handed is not None:
            self._direct[slot.instance][slot.seq_slot].extend(handed[1])

    def _null_entry(self, template: Entry) -> Entry:
        """A null request shaped like ``template`` (zeros, READY false): no one gets its reply."""
        src = template.request
        req = InferRequest(
            model_name=src.model_name,
            model_version=src.model_version,
            inputs={k: np.zeros_like(v) for k, v in src.inputs.items()},
            input_datatypes=dict(src.input_datatypes),
            batch_size=1,
        )
        set_sequence(req, SequenceInfo())
        self._add_controls(req, ready=False)
        return Entry(req, 1, shape_key=template.shape_key, context=None)

    # ---------------------------------------------------------------- the reaper

    def _reaper_loop(self) -> None:
        with self._seq_cond:
            while not self._reaper_stop:
                ended, next_us = self._router.reap(self._seq_clock() // 1000)
                for _, slot in ended:
                    self._place(slot, [None])
                wait = None if next_us is None else max(0.0, next_us / 1e6 - self._now_s())
                self._reaper_idle = wait is None
                self._reaper_cond.wait(wait)
                self._reaper_idle = False

    def _now_s(self) -> float:
        return self._seq_clock() / 1e9


def _stopping() -> ServerError:
    return ServerError(
        "Server is stopping, scheduler for model has stopped accepting new inference requests",
        Code.UNAVAILABLE,
    )


def unsupported(cfg: mc.ModelConfig) -> str | None:
    """Why this server cannot serve a valid ``sequence_batching`` config (None: it can)."""
    sb = cfg.sequence_batching
    if sb.state:
        return "implicit state (sequence_batching.state) is not implemented by this server"
    if sb.iterative_sequence:
        return "iterative sequences are not implemented by this server"
    if sb.HasField("oldest") and sb.oldest.preserve_ordering:
        return "sequence_batching.oldest.preserve_ordering is not implemented by this server"
    return None


def _is_end(entry: Entry) -> bool:
    return sequence_of(entry.request).end
