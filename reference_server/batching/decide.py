"""Dynamic batching: the pure batch-formation decision and its queue structures.

The decision (:func:`decide`) is one literal step of Triton's ``GetDynamicBatch``
(``research/triton_spec.md`` §3.4): given the queue in scan order, the open batch and the clock,
say how many queue entries to move into the open batch, whether to seal it, and when to look
again. It is a pure function so it can be tested against planted scenarios and with property
tests; :class:`~reference_server.batching.scheduler.Scheduler` runs it on a thread.

Queue structure (§3.3) lives here too: :class:`PriorityQueue` keeps, per priority level, an
"unexpired" FIFO followed by a "delayed" FIFO and applies the level's queue policy.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

#: With an empty queue Triton's batcher sleeps at most this long (``default_wait_microseconds``,
#: 500 ms): the one timer that moves requests an arrival did not wake it for into a batch still
#: waiting for an instance (the scheduler's ``arrival_wakes``; the simulator's too).
IDLE_WAIT_S = 0.5


@dataclass(frozen=True)
class BatchingParams:
    """The batcher's view of ``dynamic_batching`` and ``max_batch_size``.

    Attributes:
        max_batch_size: ``MBS = max(1, max_batch_size)``.
        preferred: Preferred batch sizes after normalization (``P``; may be empty).
        max_queue_delay_ns: ``D`` in nanoseconds (0 = dispatch at once).
    """

    max_batch_size: int
    preferred: frozenset[int] = frozenset()
    max_queue_delay_ns: int = 0

    @property
    def max_preferred(self) -> int:
        """``Pmax``: the largest preferred size, 0 when there is none."""
        return max(self.preferred, default=0)


@dataclass(frozen=True)
class Candidate:
    """What the decision needs to know about one queued request.

    Attributes:
        batch_size: ``bs(r) = max(1, request batch size)``.
        enqueue_ns: When the request entered the batcher (``t_enq``).
        deadline_ns: Queue-policy timeout deadline, or None.
        shape_key: Requests may share a batch only when their keys are equal (§3.4
            "required equal inputs"); the first request of a batch is the template.
    """

    batch_size: int
    enqueue_ns: int
    deadline_ns: int | None = None
    shape_key: Hashable = None


@dataclass(frozen=True)
class OpenBatch:
    """The batch the batcher may still add to (``B``), as the decision sees it.

    Attributes:
        size: ``|B|``, the sum of batch sizes already in it (0 = empty).
        shape_key: The template's key (the first request of B), None when empty.
    """

    size: int = 0
    shape_key: Hashable = None


@dataclass(frozen=True)
class Decision:
    """Outcome of one batcher step.

    Attributes:
        take: How many queue entries (a prefix in scan order) move into the open batch.
        seal: The open batch must not grow any further after this step.
        merge_blocked: The scan stopped at an incompatible shape (blocks instance-side merge).
        wake_at_ns: When nothing is taken: the time to look again (None = only on an event).
        next_preferred: Triton's ``next_preferred_batch_size_`` as this step sets it (None:
            unchanged; a new open batch resets it to 0): the queued batch size at which an
            arrival wakes the batcher again (:meth:`~reference_server.batching.scheduler.
            Scheduler.arrival_wakes`). Set only by a step with a queue delay that takes
            nothing or grows a waiting batch.
    """

    take: int
    seal: bool = False
    merge_blocked: bool = False
    wake_at_ns: int | None = None
    next_preferred: int | None = None


def decide(
    queue: Sequence[Candidate], batch: OpenBatch, params: BatchingParams, now_ns: int
) -> Decision:
    """One step of Triton's dynamic batch formation (§3.4, step 4-6).

    Args:
        queue: Queued requests in scan order (policy already applied).
        batch: The open batch (empty when a new batch starts).
        params: Batching parameters of the model.
        now_ns: Current monotonic time.

    Returns:
        How many requests to take and whether to seal the batch, or when to wake up.
    """
    mbs = max(1, params.max_batch_size)
    pmax = params.max_preferred
    delay = params.max_queue_delay_ns
    size = batch.size
    template = batch.shape_key
    seal = False
    merge_blocked = False
    pending = 0  # len(pending)
    total = 0  # s = sum of pending batch sizes
    best = 0
    best_n = 0
    cut = False
    for req in queue:
        if size + pending == 0:
            # The very first request of a batch is always accepted and sets the template,
            # even if it alone is larger than every preferred size.
            template = req.shape_key
        else:
            if size + total + req.batch_size > pmax and best == 0:
                # The "cap marker": what fits under Pmax could be sent now.
                best = total
                best_n = pending
                seal = True
            if size + total + req.batch_size > mbs:
                cut = True
                break
            if req.shape_key != template:
                cut = True
                merge_blocked = True
                break
        pending += 1
        total += req.batch_size
        if size + total in params.preferred:
            best = total
            best_n = pending

    oldest = min((r.enqueue_ns for r in queue[:pending]), default=now_ns)
    exceeded = delay > 0 and now_ns - oldest >= delay

    if best > 0 and not exceeded:
        return Decision(best_n, seal=seal or delay == 0, merge_blocked=merge_blocked)
    if pending == 0:
        return Decision(0, seal=seal, merge_blocked=merge_blocked)
    if cut or size + total >= pmax:
        return Decision(pending, seal=True, merge_blocked=merge_blocked)
    if exceeded or delay == 0:
        return Decision(pending, seal=seal, merge_blocked=merge_blocked)
    # The next preferred size above what B and the pending requests hold (Pmax is above them
    # here), less what B holds (Triton subtracts B's size before the pending requests join
    # it, so after a growing step the threshold counts from B's old size: a quirk, kept).
    next_preferred = min(p for p in params.preferred if p > size + total) - size
    if size > 0 and not seal and size not in params.preferred:
        return Decision(
            pending, seal=seal, merge_blocked=merge_blocked, next_preferred=next_preferred
        )
    wake = oldest + delay
    deadlines = [r.deadline_ns for r in queue[:pending] if r.deadline_ns is not None]
    if deadlines:
        wake = min(wake, *deadlines)
    return Decision(
        0, seal=seal, merge_blocked=merge_blocked, wake_at_ns=wake, next_preferred=next_preferred
    )


# --------------------------------------------------------------------------------------------
# Queue structure (§3.3)

T = TypeVar("T")


@dataclass(frozen=True)
class QueuePolicy:
    """A level's ``ModelQueuePolicy``.

    Attributes:
        delay_on_timeout: ``timeout_action: DELAY`` (else REJECT).
        default_timeout_us: Timeout for requests of this level (0 = none).
        allow_timeout_override: A request may shorten the timeout.
        max_queue_size: Maximum queued requests of this level (0 = unbounded).
    """

    delay_on_timeout: bool = False
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def timeout_us(self, requested_us: int) -> int:
        """The timeout that applies to a request asking for ``requested_us`` (§3.2)."""
        if (
            self.allow_timeout_override
            and requested_us != 0
            and requested_us < self.default_timeout_us
        ):
            return requested_us
        return self.default_timeout_us


@dataclass
class _Level(Generic[T]):
    policy: QueuePolicy
    unexpired: collections.deque[T] = field(default_factory=collections.deque)
    delayed: collections.deque[T] = field(default_factory=collections.deque)

    def __len__(self) -> int:
        return len(self.unexpired) + len(self.delayed)


class PriorityQueue(Generic[T]):
    """Requests per priority level, scanned level 1 first (unexpired, then delayed).

    Args:
        default_policy: Policy of levels without their own.
        level_policies: ``priority_queue_policy`` per level.
    """

    def __init__(
        self, default_policy: QueuePolicy, level_policies: dict[int, QueuePolicy] | None = None
    ) -> None:
        self._default = default_policy
        self._policies = dict(level_policies or {})
        self._levels: dict[int, _Level[T]] = {}

    def policy(self, level: int) -> QueuePolicy:
        """The policy that governs ``level``."""
        return self._policies.get(level, self._default)

    def _level(self, level: int) -> _Level[T]:
        if level not in self._levels:
            self._levels[level] = _Level(self.policy(level))
            self._levels = dict(sorted(self._levels.items()))
        return self._levels[level]

    def level_size(self, level: int) -> int:
        """Requests currently queued at ``level``."""
        lv = self._levels.get(level)
        return len(lv) if lv else 0

    def push(self, level: int, item: T) -> None:
        """Append ``item`` to the unexpired FIFO of ``level``."""
        self._level(level).unexpired.append(item)

    def __len__(self) -> int:
        return sum(len(lv) for lv in self._levels.values())

    def __iter__(self) -> Iterator[T]:
        for lv in self._levels.values():
            yield from lv.unexpired
            yield from lv.delayed

    def pop_front(self, count: int) -> list[T]:
        """Remove and return the first ``count`` items in scan order."""
        out: list[T] = []
        for lv in self._levels.values():
            for fifo in (lv.unexpired, lv.delayed):
                while fifo and len(out) < count:
                    out.append(fifo.popleft())
            if len(out) >= count:
                break
        return out

    def sweep(
        self, is_dropped: Callable[[T], bool], is_expired: Callable[[T], bool]
    ) -> list[tuple[T, str]]:
        """Apply cancellation and timeout policy to every queued item.

        Args:
            is_dropped: ``item -> bool``: cancelled by the client.
            is_expired: ``item -> bool``: its queue timeout has passed.

        Returns:
            Removed items with the reason: ``"CANCELED"`` or ``"REJECTED"``. Expired items of
            DELAY levels are moved to the tail of their level's delayed FIFO instead.
        """
        removed: list[tuple[T, str]] = []
        for lv in self._levels.values():
            keep: collections.deque[T] = collections.deque()
            moved: list[T] = []
            for item in lv.unexpired:
                if is_dropped(item):
                    removed.append((item, "CANCELED"))
                elif is_expired(item):
                    if lv.policy.delay_on_timeout:
                        moved.append(item)
                    else:
                        removed.append((item, "REJECTED"))
                else:
                    keep.append(item)
            delayed: collections.deque[T] = collections.deque()
            for item in lv.delayed:
                if is_dropped(item):
                    removed.append((item, "CANCELED"))
                else:
                    delayed.append(item)
            delayed.extend(moved)
            lv.unexpired = keep
            lv.delayed = delayed
        return removed
