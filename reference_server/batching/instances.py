"""Model instances and the devices they run on.

Each non-passive instance owns one backend object and one thread that loops: take the next
batch from the model's scheduler, execute it, hand the responses back. Instances placed on the
same (simulated or real) GPU share one :class:`Device`: the simulated backend books the device
part of an execution on its meter's timeline, so device work is serialised across instances (and
across models on that device) while host work overlaps, as on real hardware.

With ``--rate-limit execution_count`` the server has one :class:`RateLimitedDispatch`: the pure
:class:`~reference_server.batching.rate_limiter.RateLimiter` behind a lock, which every
rate-limited scheduler hands its batches to and which delivers each batch to the instance it
chose (``Scheduler.deliver``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from reference_server.backends.base import Backend
from reference_server.batching.rate_limiter import (
    InstanceLimits,
    RateLimiter,
    RateLimiterError,
    ResourceLimit,
)
from reference_server.batching.scheduler import Batch, Scheduler, reduce_timer_slack
from reference_server.core.gpu import DeviceMeter

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Device:
    """One execution device shared by the instances placed on it.

    Attributes:
        name: ``"cpu"``, ``"gpu0"``, ``"sim-gpu0"``...
        meter: Busy time and memory of simulated instances (``reference_server.core.gpu``).
    """

    name: str
    meter: DeviceMeter = field(default_factory=DeviceMeter)


class DeviceRegistry:
    """The devices of one server (no process-global state)."""

    def __init__(self) -> None:
        self._devices: dict[str, Device] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Device:
        """Return the device called ``name``, creating it on first use."""
        with self._lock:
            if name not in self._devices:
                self._devices[name] = Device(name)
            return self._devices[name]

    def devices(self) -> list[Device]:
        """Every device created so far."""
        with self._lock:
            return list(self._devices.values())


class PauseGate:
    """Holds executions back until a given time (the ``pause_device`` test hook)."""

    def __init__(self) -> None:
        self._until = 0.0
        self._cond = threading.Condition()

    def pause(self, seconds: float) -> None:
        """Make executions that start during the next ``seconds`` wait until it ends."""
        with self._cond:
            self._until = max(self._until, time.monotonic() + seconds)

    def release(self) -> None:
        """End a pause early (used on unload so draining is not held up)."""
        with self._cond:
            self._until = 0.0
            self._cond.notify_all()

    def wait(self) -> None:
        """Block while a pause is in effect (sleeps, never spins)."""
        with self._cond:
            while (left := self._until - time.monotonic()) > 0:
                self._cond.wait(left)


@dataclass(eq=False)
class InstanceSpec:
    """Where one instance runs, from the config's instance groups (§2.2).

    Attributes:
        name: ``<group name>_<k>``.
        kind: ``KIND_CPU`` / ``KIND_GPU`` / ``KIND_MODEL``.
        device_id: GPU id for KIND_GPU, else 0.
        passive: Created but never given work.
        limits: Its group's ``rate_limiter`` (used only with rate limiting on).
    """

    name: str
    kind: str
    device_id: int = 0
    passive: bool = False
    limits: InstanceLimits = field(default_factory=InstanceLimits)


class RateLimitedDispatch:
    """The server's rate limiter with its lock: where rate-limited schedulers send batches.

    Implements :class:`reference_server.batching.scheduler.Dispatch`. Allocations are delivered
    to the chosen instance's mailbox while the lock is held (the rate limiter's lock comes
    before any scheduler's).

    Args:
        explicit: ``--rate-limit-resource`` values.
    """

    def __init__(self, explicit: Sequence[ResourceLimit] = ()) -> None:
        self._limiter: RateLimiter[Batch] = RateLimiter(explicit)
        self._lock = threading.Lock()

    def register(self, scheduler: Scheduler, limits: Sequence[InstanceLimits]) -> None:
        """Register a model's non-passive instances, slot ``k`` = ``limits[k]``.

        Raises:
            RateLimiterError: the resources cannot be scheduled; nothing stays registered.
        """
        with self._lock:
            try:
                for slot, instance_limits in enumerate(limits):
                    self._limiter.add_instance(scheduler, (scheduler, slot), instance_limits)
            except RateLimiterError:
                self._limiter.remove_model(scheduler)
                raise

    def unregister(self, scheduler: Scheduler) -> None:
        """Forget a model (after it drained, or when its load failed)."""
        with self._lock:
            self._limiter.remove_model(scheduler)

    def submit(self, scheduler: Scheduler, batch: Batch) -> None:
        """A batcher formed ``batch``; it waits until an instance may run it."""
        with self._lock:
            self._deliver(self._limiter.enqueue(scheduler, batch))

    def release(self, scheduler: Scheduler, slot: int) -> None:
        """Instance ``slot`` of ``scheduler`` finished; its resources go back."""
        with self._lock:
            self._deliver(self._limiter.release((scheduler, slot)))

    def exec_count(self, scheduler: Scheduler, slot: int) -> int:
        """Executions the rate limiter counted for an instance (Triton's two start-up ones too)."""
        with self._lock:
            return self._limiter.exec_count((scheduler, slot))

    def capacity(self, name: str, device: int) -> int:
        """Capacity of a resource now (``rate_limiter.GLOBAL_DEVICE`` for global ones)."""
        with self._lock:
            return self._limiter.pool.capacity(name, device)

    @staticmethod
    def _deliver(allocations: list[tuple[Hashable, Batch]]) -> None:
        for key, batch in allocations:
            assert isinstance(key, tuple)
            scheduler, slot = key
            scheduler.deliver(slot, batch)


class ModelInstance:
    """One instance: a backend plus the thread that feeds it batches.

    Args:
        spec: Placement of the instance.
        backend: Initialized backend.
        scheduler: The model's scheduler to take batches from.
        run_batch: Executes one batch on this instance and delivers its responses.
        slot: Index among the model's non-passive instances (the rate limiter's name for it).
    """

    def __init__(
        self,
        spec: InstanceSpec,
        backend: Backend,
        scheduler: Scheduler,
        run_batch: Callable[[ModelInstance, Batch], None],
        slot: int = 0,
    ) -> None:
        self.spec = spec
        self.slot = slot
        self.backend = backend
        self._scheduler = scheduler
        self._run_batch = run_batch
        self._thread: threading.Thread | None = None
        self.execution_count = 0

    def start(self) -> None:
        """Start the instance thread (passive instances never get one)."""
        if self.spec.passive or self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._loop, name=f"instance-{self.spec.name}", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to exit (after the scheduler drained)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        # An idle instance runs the batcher's timed waits itself (Scheduler.next_batch).
        reduce_timer_slack()
        while (batch := self._scheduler.next_batch(self.slot)) is not None:
            try:
                self._run_batch(self, batch)
            except Exception:
                # A bug in one execution must not take the instance down with it.
                logger.exception("instance %s failed to run a batch", self.spec.name)
            finally:
                self.execution_count += 1
                self._scheduler.batch_done(self.slot)
