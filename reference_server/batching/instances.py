"""Model instances and the devices they run on.

Each non-passive instance owns one backend object and one thread that loops: take the next
batch from the model's scheduler, execute it, hand the responses back. Instances placed on the
same (simulated or real) GPU share one :class:`Device`: the simulated backend holds its lock for
the device part of an execution, so device work is serialised across instances (and across
models on that device) while host work overlaps, as on real hardware.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from reference_server.backends.base import Backend
from reference_server.batching.scheduler import Batch, Scheduler, reduce_timer_slack
from reference_server.core.gpu import DeviceMeter

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Device:
    """One execution device shared by the instances placed on it.

    Attributes:
        name: ``"cpu"``, ``"gpu0"``, ``"sim-gpu0"``...
        lock: Held for the device part of an execution (serialises device work).
        meter: Busy time and memory of simulated instances (``reference_server.core.gpu``).
    """

    name: str
    lock: threading.Lock = field(default_factory=threading.Lock)
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
    """

    name: str
    kind: str
    device_id: int = 0
    passive: bool = False


class ModelInstance:
    """One instance: a backend plus the thread that feeds it batches.

    Args:
        spec: Placement of the instance.
        backend: Initialized backend.
        scheduler: The model's scheduler to take batches from.
        run_batch: Executes one batch on this instance and delivers its responses.
    """

    def __init__(
        self,
        spec: InstanceSpec,
        backend: Backend,
        scheduler: Scheduler,
        run_batch: Callable[[ModelInstance, Batch], None],
    ) -> None:
        self.spec = spec
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
        while (batch := self._scheduler.next_batch()) is not None:
            try:
                self._run_batch(self, batch)
            except Exception:
                # A bug in one execution must not take the instance down with it.
                logger.exception("instance %s failed to run a batch", self.spec.name)
            finally:
                self.execution_count += 1
                self._scheduler.batch_done()
