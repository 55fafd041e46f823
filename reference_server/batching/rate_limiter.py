"""Triton's rate limiter (``--rate-limit execution_count``) as a pure state machine.

No threads, no clocks: every method is one event (a batch handed over by a batcher, an
execution finished) and returns the allocations it made, ``(instance key, payload)`` pairs; the
threaded glue (:mod:`reference_server.batching.scheduler`,
:mod:`reference_server.batching.instances`) holds one lock around each call and delivers the
payloads. It follows ``core/src/rate_limiter.cc`` (``research/triton_spec.md`` §3.11), including
the parts that were checked against the real Triton 2.51 and that the documentation leaves out:

* An instance moves AVAILABLE -> STAGED (bound to the next payload of its model) -> ALLOCATED
  (its resources taken, the payload delivered) -> AVAILABLE again when the execution finished.
* Available instances of a model are staged lowest ``exec_count * max(priority, 1)`` first;
  staged instances (server-wide) are allocated in the same order. Ties go to the instance that
  joined the queue first (what ``std::priority_queue`` does with two entries).
* ``exec_count`` starts at 2: Triton runs each instance's initialization and warm-up through
  the rate limiter, so they count.
* Each event makes at most one allocation attempt, on the best staged instance only (Triton's
  ``AttemptAllocation``): when that instance's resources are taken nothing else is allocated,
  not even an instance that needs no resources (head-of-line blocking), and a staged instance
  behind one that was just allocated waits for the next event.
* Resource capacity: the largest count any registered instance asks for, unless
  ``--rate-limit-resource`` values are given; then every resource needs one (an uncovered one has
  capacity 0). A capacity below an instance's need, or a name used both as a global and as a
  per-device resource, fails the load with Triton's message. Names are case-sensitive (in 2.51
  ``tritonserver`` lower-cases a copy of the flag value and then parses the original).

Errors: :class:`RateLimiterError` (a :class:`~reference_server.core.errors.ServerError`,
INVALID_ARG), raised by :meth:`RateLimiter.add_instance` and :func:`parse_resource_limit`.
"""

from __future__ import annotations

import collections
import enum
import heapq
import itertools
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from reference_server.core.errors import Code, ServerError

#: Key of resources shared by the whole server (``global: true``), as in Triton.
GLOBAL_DEVICE = -2
#: Key of ``--rate-limit-resource`` values given without a device: every device.
EVERY_DEVICE = -1
#: Executions each instance has when it starts serving: Triton's init and warm-up payloads.
INITIAL_EXEC_COUNT = 2

P = TypeVar("P")

_FLAG_FORMAT = (
    "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
    "'<resource_name>:<count>'. Got {}"
)


class InstanceState(enum.Enum):
    """Where an instance is in the rate limiter's cycle."""

    AVAILABLE = "AVAILABLE"  # idle, or waiting for a payload of its model
    STAGED = "STAGED"  # bound to a payload, waiting for its resources
    ALLOCATED = "ALLOCATED"  # resources held, payload delivered, executing


class RateLimiterError(ServerError):
    """A rate-limiter resource problem that fails a model load (or a bad flag)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Code.INVALID_ARG)


@dataclass(frozen=True)
class ResourceNeed:
    """One ``rate_limiter.resources`` entry of an instance group.

    Attributes:
        name: Resource name (case-sensitive).
        count: Copies the instance holds while it executes.
        global_: One pool for the whole server instead of one per device.
    """

    name: str
    count: int
    global_: bool = False


@dataclass(frozen=True)
class InstanceLimits:
    """What the rate limiter knows of one instance.

    Attributes:
        resources: Its resource needs.
        priority: ``rate_limiter.priority``; 0 counts as 1. Lower runs more often.
        device_id: Device whose pool its per-device resources come from (0 for CPU).
    """

    resources: tuple[ResourceNeed, ...] = ()
    priority: int = 0
    device_id: int = 0

    def needs(self) -> dict[tuple[int, str], int]:
        """``{(device key, name): count}``; a repeated name keeps its last count (as Triton)."""
        out: dict[tuple[int, str], int] = {}
        for need in self.resources:
            out[(GLOBAL_DEVICE if need.global_ else self.device_id, need.name)] = need.count
        return out


@dataclass(frozen=True)
class ResourceLimit:
    """One ``--rate-limit-resource <name>:<count>[:<device>]`` value.

    Attributes:
        name: Resource name (case-sensitive).
        count: Copies available.
        device: Device id, or :data:`EVERY_DEVICE` when the flag named none.
    """

    name: str
    count: int
    device: int = EVERY_DEVICE

    def flag(self) -> str:
        """The value as ``--rate-limit-resource`` takes it."""
        suffix = "" if self.device == EVERY_DEVICE else f":{self.device}"
        return f"{self.name}:{self.count}{suffix}"


_INT = re.compile(r"^\s*[+-]?\d+\s*$")


def parse_resource_limit(text: str) -> ResourceLimit:
    """Parse ``<name>:<count>`` or ``<name>:<count>:<device>`` as ``tritonserver`` does.

    Raises:
        RateLimiterError: not two or three fields, or a count/device that is not an integer
            (Triton exits with the same format message), or a negative count.
    """
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(_INT.match(p) for p in parts[1:]):
        raise RateLimiterError(_FLAG_FORMAT.format(text))
    count = int(parts[1])
    device = int(parts[2]) if len(parts) == 3 else EVERY_DEVICE
    if count < 0 or device < EVERY_DEVICE:
        raise RateLimiterError(
            f"--rate-limit-resource {text}: the count must be >= 0 and the device a GPU id"
        )
    return ResourceLimit(parts[0], count, device)


class ResourcePool:
    """Capacities and allocations of every resource of one server (Triton's ResourceManager).

    Args:
        explicit: ``--rate-limit-resource`` values; empty = capacities follow the instances.
    """

    def __init__(self, explicit: Sequence[ResourceLimit] = ()) -> None:
        self._explicit: dict[tuple[int, str], int] = {}
        for limit in explicit:
            # A repeated flag for the same name and device: the last one wins (a std::map).
            self._explicit[(limit.device, limit.name)] = limit.count
        self._needs: dict[Hashable, dict[tuple[int, str], int]] = {}
        self._allocated: collections.Counter[tuple[int, str]] = collections.Counter()

    def capacity(self, name: str, device: int = GLOBAL_DEVICE) -> int:
        """Copies of ``name`` in the pool of ``device`` (:data:`GLOBAL_DEVICE` = global)."""
        key = (device, name)
        if not self._explicit:
            return max((needs.get(key, 0) for needs in self._needs.values()), default=0)
        if device == GLOBAL_DEVICE:
            # A global resource takes the largest value given for its name, on any device.
            return max((c for (_, n), c in self._explicit.items() if n == name), default=0)
        return max(self._explicit.get(key, 0), self._explicit.get((EVERY_DEVICE, name), 0))

    def add(self, key: Hashable, needs: dict[tuple[int, str], int]) -> None:
        """Register an instance's needs; refused (and not kept) when they cannot be met.

        Raises:
            RateLimiterError: Triton's "Resource count for ..." or "present as both global and
                device-specific" message.
        """
        self._needs[key] = dict(needs)
        try:
            self._validate()
        except RateLimiterError:
            del self._needs[key]
            raise

    def remove(self, key: Hashable) -> None:
        """Forget an instance (capacities that followed it may shrink)."""
        self._needs.pop(key, None)

    def _max_needs(self) -> dict[tuple[int, str], int]:
        out: dict[tuple[int, str], int] = {}
        for needs in self._needs.values():
            for key, count in needs.items():
                out[key] = max(out.get(key, 0), count)
        return out

    def _validate(self) -> None:
        # Triton's order: the explicit limits first (device keys ascending, names in byte
        # order), then global vs per-device names.
        max_needs = self._max_needs()
        if self._explicit:
            for device, name in sorted(max_needs):
                limit = self.capacity(name, device)
                if limit < max_needs[(device, name)]:
                    raise RateLimiterError(
                        f'Resource count for "{name}" is limited to {limit} which will prevent '
                        "scheduling of one or more model instances, the minimum required count "
                        f"is {max_needs[(device, name)]}"
                    )
        global_names = sorted(name for device, name in max_needs if device == GLOBAL_DEVICE)
        for global_name in global_names:
            for device, name in sorted(max_needs):
                if device != GLOBAL_DEVICE and name == global_name:
                    raise RateLimiterError(
                        f'Resource "{name}" is present as both global and device-specific '
                        "resource in the model configuration."
                    )

    def try_allocate(self, key: Hashable) -> bool:
        """Take every resource ``key`` needs, or nothing when one is short."""
        needs = self._needs.get(key)
        if needs is None:
            return False
        if any(self._allocated[r] + c > self.capacity(r[1], r[0]) for r, c in needs.items()):
            return False
        self._allocated.update(needs)
        return True

    def release(self, key: Hashable) -> None:
        """Give back what :meth:`try_allocate` took for ``key``."""
        self._allocated.subtract(self._needs.get(key, {}))

    def in_use(self, name: str, device: int = GLOBAL_DEVICE) -> int:
        """Copies of ``name`` allocated now."""
        return self._allocated[(device, name)]


@dataclass(eq=False)
class _Instance(Generic[P]):
    key: Hashable
    model: Hashable
    priority: int
    exec_count: int = INITIAL_EXEC_COUNT
    state: InstanceState = InstanceState.AVAILABLE
    payload: P | None = None

    @property
    def score(self) -> int:
        # Triton's ScaledPriority: the count changes only while the instance is in no queue.
        return self.exec_count * max(self.priority, 1)


@dataclass(eq=False)
class _Model(Generic[P]):
    waiting: collections.deque[P] = field(default_factory=collections.deque)
    available: list[tuple[int, int, _Instance[P]]] = field(default_factory=list)
    instances: list[_Instance[P]] = field(default_factory=list)


class RateLimiter(Generic[P]):
    """The server's rate limiter: which instance runs which payload, and when.

    Args:
        explicit: ``--rate-limit-resource`` values.
    """

    def __init__(self, explicit: Sequence[ResourceLimit] = ()) -> None:
        self.pool = ResourcePool(explicit)
        self._models: dict[Hashable, _Model[P]] = {}
        self._instances: dict[Hashable, _Instance[P]] = {}
        self._staged: list[tuple[int, int, _Instance[P]]] = []
        self._seq = itertools.count()

    # ---------------------------------------------------------------- registration

    def add_instance(self, model: Hashable, key: Hashable, limits: InstanceLimits) -> None:
        """Register an instance of ``model`` (available, nothing executed yet).

        Raises:
            RateLimiterError: its resources cannot be scheduled (the load must fail).
        """
        self.pool.add(key, limits.needs())
        ctx = self._models.setdefault(model, _Model())
        instance: _Instance[P] = _Instance(key, model, limits.priority)
        ctx.instances.append(instance)
        self._instances[key] = instance
        self._push(ctx.available, instance)

    def remove_model(self, model: Hashable) -> None:
        """Forget a model and its instances (after it drained: nothing of it is pending)."""
        ctx = self._models.pop(model, None)
        if ctx is None:
            return
        for instance in ctx.instances:
            self._instances.pop(instance.key, None)
            self.pool.remove(instance.key)
        self._staged = [e for e in self._staged if e[2].model != model]
        heapq.heapify(self._staged)

    # ---------------------------------------------------------------- events

    def enqueue(self, model: Hashable, payload: P) -> list[tuple[Hashable, P]]:
        """A batcher hands over a payload for any instance of ``model``."""
        allocations: list[tuple[Hashable, P]] = []
        self._models[model].waiting.append(payload)
        self._stage_available(self._models[model], None, allocations)
        return allocations

    def release(self, key: Hashable) -> list[tuple[Hashable, P]]:
        """The instance ``key`` finished executing its payload."""
        allocations: list[tuple[Hashable, P]] = []
        instance = self._instances[key]
        instance.exec_count += 1
        instance.state = InstanceState.AVAILABLE
        instance.payload = None
        ctx = self._models[instance.model]
        self._push(ctx.available, instance)
        self.pool.release(key)
        if ctx.waiting:
            self._stage_available(ctx, instance, allocations)
        self._attempt_allocation(allocations)
        return allocations

    # ---------------------------------------------------------------- introspection

    def exec_count(self, key: Hashable) -> int:
        """Executions of an instance so far, the two start-up ones included."""
        return self._instances[key].exec_count

    def waiting(self, model: Hashable) -> int:
        """Payloads of ``model`` not yet bound to an instance."""
        ctx = self._models.get(model)
        return len(ctx.waiting) if ctx is not None else 0

    def state(self, key: Hashable) -> InstanceState:
        """Where instance ``key`` is now."""
        return self._instances[key].state

    # ---------------------------------------------------------------- internals

    def _push(self, heap: list[tuple[int, int, _Instance[P]]], instance: _Instance[P]) -> None:
        heapq.heappush(heap, (instance.score, next(self._seq), instance))

    def _stage_available(
        self,
        ctx: _Model[P],
        only: _Instance[P] | None,
        allocations: list[tuple[Hashable, P]],
    ) -> None:
        # Triton's StageInstanceIfAvailable: best available instance first, one payload each.
        kept: list[_Instance[P]] = []
        while ctx.available:
            instance = heapq.heappop(ctx.available)[2]
            if (only is not None and instance is not only) or not ctx.waiting:
                kept.append(instance)
                continue
            instance.state = InstanceState.STAGED
            instance.payload = ctx.waiting.popleft()
            self._push(self._staged, instance)
            self._attempt_allocation(allocations)
        for instance in kept:
            self._push(ctx.available, instance)

    def _attempt_allocation(self, allocations: list[tuple[Hashable, P]]) -> None:
        # One try, on the best staged instance only (head-of-line blocking).
        if not self._staged:
            return
        instance = self._staged[0][2]
        if not self.pool.try_allocate(instance.key):
            return
        heapq.heappop(self._staged)
        instance.state = InstanceState.ALLOCATED
        assert instance.payload is not None
        allocations.append((instance.key, instance.payload))
